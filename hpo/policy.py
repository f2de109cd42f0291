"""Who may run code: the operator's allow-list of workload modules and trainer commands.

A study spec names what a worker runs (`trainer.workload`, `trainer.command`), and whoever can
create a study is not necessarily trusted to run code on the GPU fleet. The operator of the workers
decides: built-in workloads always run; a user workload (`package.module:Name`) runs only when its
module matches one of `workload_globs`; a command runs only when its argv starts with one of
`command_prefixes`. The worker checks before any import or process start; the server holds the same
policy as a setting and refuses other specs at creation. Standard library only: the server, the
worker and the CLI all import it.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# The names `trainer.workload` may take without any allow-list (hpo.trainer.workloads.WORKLOADS).
BUILTIN_WORKLOADS: frozenset[str] = frozenset({"synthetic_mlp", "digits", "char_lm"})

WORKLOADS_ENV = "HPO_ALLOWED_WORKLOADS"
COMMANDS_ENV = "HPO_ALLOWED_COMMANDS"


@dataclass(frozen=True)
class ExecutionPolicy:
    """`workload_globs`: fnmatch patterns on the module part of `module:Name` (`mylab.*`).
    `command_prefixes`: argv prefixes a command must start with, element by element
    (`("python", "train.py")` allows `python train.py --epochs 3`, not `python evil.py`)."""

    workload_globs: tuple[str, ...] = ()
    command_prefixes: tuple[tuple[str, ...], ...] = ()
    builtin_workloads: frozenset[str] = BUILTIN_WORKLOADS

    def workload_refusal(self, name: str) -> str | None:
        """None when `name` may run; otherwise the reason, naming the option that would allow it."""
        if name in self.builtin_workloads:
            return None
        module, sep, attribute = name.partition(":")
        if not sep or not module or not attribute:
            known = ", ".join(sorted(self.builtin_workloads))
            return f"unknown workload {name!r}; built-in: {known}, or package.module:Name where allowed"
        if any(fnmatch.fnmatchcase(module, glob) for glob in self.workload_globs):
            return None
        return (
            f"workload module {module!r} is not allowed on this fleet; its operator may allow it with "
            f"--allow-workload / {WORKLOADS_ENV} (module globs such as 'mylab.*')"
        )

    def command_refusal(self, argv: Sequence[str]) -> str | None:
        """None when `argv` may run; otherwise the reason, naming the option that would allow it."""
        if not argv:
            return "the command is empty"
        for prefix in self.command_prefixes:
            if len(argv) >= len(prefix) and tuple(argv[: len(prefix)]) == prefix:
                return None
        shown = shlex.join(list(argv)[:3]) + (" ..." if len(argv) > 3 else "")
        return (
            f"command {shown!r} is not allowed on this fleet; its operator may allow it with "
            f"--allow-command / {COMMANDS_ENV} (argv prefixes such as 'python train.py')"
        )

    def merged(self, workload_globs: Iterable[str] = (), command_prefixes: Iterable[str] = ()) -> ExecutionPolicy:
        """This policy plus globs and shell-quoted command prefixes given as options."""
        return ExecutionPolicy(
            workload_globs=self.workload_globs + tuple(workload_globs),
            command_prefixes=self.command_prefixes + tuple(parse_command_prefix(p) for p in command_prefixes),
            builtin_workloads=self.builtin_workloads,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutionPolicy:
        """`HPO_ALLOWED_WORKLOADS`: comma-separated module globs. `HPO_ALLOWED_COMMANDS`: a JSON list
        of argv prefixes (`[["python", "train.py"]]`) or shell-quoted prefixes separated by `;`."""
        env = os.environ if environ is None else environ
        globs = tuple(g.strip() for g in env.get(WORKLOADS_ENV, "").split(",") if g.strip())
        return cls(workload_globs=globs, command_prefixes=parse_command_prefixes(env.get(COMMANDS_ENV, "")))


# Environment variables a study may not set for a command: each changes what code the allowed
# program loads (the dynamic linker, interpreters' startup and search paths, shells' startup files)
# or reaches hpo's and Ray's own settings, so allowing them would widen every allowed prefix.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_ENV_DENIED_PREFIXES = ("LD_", "DYLD_", "PYTHON", "HPO_", "RAY_", "PERL", "RUBY", "NODE_", "JAVA_", "_JAVA", "GCONV")
_ENV_DENIED = frozenset({"PATH", "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "HOME", "TMPDIR"})


def env_refusal(env: object) -> str | None:
    """None when `trainer.env` may be given to a command; otherwise why not."""
    if not isinstance(env, Mapping):
        return "must be an object of NAME: value strings"
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name) or not isinstance(value, str):
            return f"{str(name)[:80]!r}: names must be letters, digits and _, values strings"
        if name.upper() in _ENV_DENIED or name.upper().startswith(_ENV_DENIED_PREFIXES):
            return f"{name} may not be set by a study (it changes what the allowed program loads)"
    return None


class PolicyError(ValueError):
    """An allow-list setting that cannot be read."""


def parse_command_prefix(text: str) -> tuple[str, ...]:
    try:
        argv = tuple(shlex.split(text))
    except ValueError as exc:
        raise PolicyError(f"command prefix {text!r}: {exc}") from None
    if not argv:
        raise PolicyError("a command prefix must not be empty")
    return argv


def parse_command_prefixes(raw: str) -> tuple[tuple[str, ...], ...]:
    raw = raw.strip()
    if not raw:
        return ()
    if raw.startswith("["):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise PolicyError(f"{COMMANDS_ENV} is not valid JSON: {exc}") from None
        if not isinstance(value, list) or not all(
            isinstance(p, list) and p and all(isinstance(a, str) for a in p) for p in value
        ):
            raise PolicyError(f"{COMMANDS_ENV} must be a JSON list of non-empty lists of strings")
        return tuple(tuple(p) for p in value)
    return tuple(parse_command_prefix(part) for part in raw.split(";") if part.strip())
