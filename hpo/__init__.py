"""hpo: hyperparameter study orchestration following the Deep Learning Tuning Playbook."""

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # `hpo.session()` for training scripts (docs/scripts.md), loaded only when asked for: the module
    # is callable, so `import hpo; hpo.session()` and `from hpo.session import session` both work.
    if name == "session":
        import importlib

        return importlib.import_module("hpo.session")
    raise AttributeError(f"module 'hpo' has no attribute {name!r}")
