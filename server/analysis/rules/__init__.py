"""The playbook's checks of a finished study, one module per kind of finding (arms, boundary,
budget, curves, divergence, feasibility, ...): each takes plain values (analysis.model) and
answers findings and warnings."""
