"""The search space of a study: its dimensions, their scales, and the mapping between each
declaration's values and the unit cube that layouts, the bayesian designer and the analysis share.

It imports nothing from the rest of hpo.server (declarations are read through the
`dimension.Declaration` protocol), so the spec, the layout, the designer and the analysis can all
build on it without an import circle."""
