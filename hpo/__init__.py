"""hpo: hyperparameter study orchestration following the Deep Learning Tuning Playbook."""

__version__ = "0.1.0"
