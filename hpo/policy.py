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
    # fnmatch patterns on `trainer.env` names the operator allows beyond DEFAULT_ALLOWED_ENV.
    env_globs: tuple[str, ...] = ()

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
            f"--allow-workload GLOB on hpo server and hpo worker, or {WORKLOADS_ENV} (module globs such as 'mylab.*')"
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
            f"--allow-command PREFIX on hpo server and hpo worker, or {COMMANDS_ENV} (argv prefixes such as "
            "'{python} train.py')"
        )

    def env_refusal(self, env: object) -> EnvRefusal | None:
        """None when a command may be given `trainer.env`; otherwise the first variable refused and why."""
        if not isinstance(env, Mapping):
            return EnvRefusal(None, "must be an object of NAME: value strings")
        for name, value in env.items():
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                return EnvRefusal(None, f"{str(name)[:80]!r}: names must be letters, digits and _ (at most 128)")
            if not isinstance(value, str) or len(value) > MAX_ENV_VALUE or "\0" in value:
                return EnvRefusal(name, f"the value must be a string of at most {MAX_ENV_VALUE} characters")
            if protected_env_name(name):
                return EnvRefusal(
                    name,
                    "is set by the worker for every trial (devices, threads, ranks, hpo's and Ray's own); "
                    "a study may not override it",
                )
            if name not in DEFAULT_ALLOWED_ENV and not any(fnmatch.fnmatchcase(name, g) for g in self.env_globs):
                return EnvRefusal(
                    name,
                    f"is not allowed on this fleet; its operator may allow it with --allow-env / {ENV_ENV} "
                    "(a variable can make an allowed program load other code, so none is allowed by default "
                    "beyond the short list in docs/security.md)",
                )
        return None

    def trainer_refusal(self, trainer: Mapping[str, object]) -> str | None:
        """Why this policy refuses what a trial's `trainer` settings would run (a command, its env,
        a workload), naming the setting; None when it may run. The worker checks it before any
        import or process start; the server before it hands a trial to a worker with this policy."""
        command = trainer.get("command")
        if command is not None:
            if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
                return "trainer.command must be a list of strings"
            reason = self.command_refusal(command)
            if reason is not None:
                return f"trainer.command: {reason}"
        if trainer.get("env") is not None:
            refusal = self.env_refusal(trainer["env"])
            if refusal is not None:
                return f"{refusal.field}: {refusal.reason}"
        workload = trainer.get("workload", "synthetic_mlp")
        if not isinstance(workload, str):
            return "trainer.workload must be a string"
        reason = self.workload_refusal(workload)
        return None if reason is None else f"trainer.workload: {reason}"

    def capabilities(self) -> dict[str, list[object]]:
        """What a worker tells the server it may run (`POST /workers/claim`), so the server never
        hands it a trial it would refuse."""
        return {
            "workloads": list(self.workload_globs),
            "commands": [list(prefix) for prefix in self.command_prefixes],
            "env": list(self.env_globs),
        }

    def merged(
        self,
        workload_globs: Iterable[str] = (),
        command_prefixes: Iterable[str] = (),
        env_globs: Iterable[str] = (),
    ) -> ExecutionPolicy:
        """This policy plus globs and shell-quoted command prefixes given as options."""
        return ExecutionPolicy(
            workload_globs=self.workload_globs + tuple(workload_globs),
            command_prefixes=self.command_prefixes + tuple(parse_command_prefix(p) for p in command_prefixes),
            builtin_workloads=self.builtin_workloads,
            env_globs=self.env_globs + tuple(parse_env_glob(g) for g in env_globs),
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ExecutionPolicy:
        """`HPO_ALLOWED_WORKLOADS`: comma-separated module globs. `HPO_ALLOWED_COMMANDS`: a JSON list
        of argv prefixes (`[["python", "train.py"]]`) or shell-quoted prefixes separated by `;`."""
        env = os.environ if environ is None else environ
        globs = tuple(g.strip() for g in env.get(WORKLOADS_ENV, "").split(",") if g.strip())
        env_globs = tuple(parse_env_glob(g.strip()) for g in env.get(ENV_ENV, "").split(",") if g.strip())
        return cls(
            workload_globs=globs,
            command_prefixes=parse_command_prefixes(env.get(COMMANDS_ENV, "")),
            env_globs=env_globs,
        )


# `trainer.env` is an allow-list (docs/security.md, "trainer.env"): a study may set only the names
# below, which tune a library's behaviour and cannot make an allowed program load other code, plus
# whatever the operator allows with `--allow-env` / HPO_ALLOWED_ENV. A deny-list cannot work:
# GIT_CONFIG_KEY_0=core.fsmonitor, GIT_SSH_COMMAND, PAGER, OPENSSL_CONF, TAR_OPTIONS, NCCL_*_PLUGIN
# and proxies each run or load code through some library an allowed program happens to use.
DEFAULT_ALLOWED_ENV: frozenset[str] = frozenset(
    {
        "CUBLAS_WORKSPACE_CONFIG",
        "CUDA_LAUNCH_BLOCKING",
        "HF_DATASETS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_HUB_OFFLINE",
        "NCCL_DEBUG",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "TF_CPP_MIN_LOG_LEVEL",
        "TOKENIZERS_PARALLELISM",
        "TORCH_DISTRIBUTED_DEBUG",
        "TORCH_SHOW_CPP_STACKTRACES",
        "TRANSFORMERS_OFFLINE",
        "WANDB_MODE",
        "WANDB_SILENT",
    }
)
# What `torchrun` (and hpo's launcher for a multi-process trial) sets for each process.
LAUNCHER_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# The accelerators Ray gives a task.
DEVICE_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "NEURON_RT_VISIBLE_CORES",
    "TPU_VISIBLE_CHIPS",
)
# What the worker, Ray and the launcher set for every trial (devices, threads, ranks, rendezvous,
# hpo's own files, the search path hpo gives a workload): never a study's to change, whatever the
# operator's globs allow, or `CUDA_VISIBLE_DEVICES` would take other trials' GPUs.
PROTECTED_ENV: frozenset[str] = frozenset({*LAUNCHER_ENV, *DEVICE_ENV, "PATH", "HOME", "USER", "LOGNAME", "PYTHONPATH"})
_PROTECTED_PREFIXES = ("HPO_", "RAY_")
_PROTECTED_SUFFIXES = ("_NUM_THREADS",)
ENV_ENV = "HPO_ALLOWED_ENV"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MAX_ENV_VALUE = 4096


def protected_env_name(name: str) -> bool:
    """Whether the worker or Ray owns `name` for every trial (a study may never set it)."""
    upper = name.upper()
    return upper in PROTECTED_ENV or upper.startswith(_PROTECTED_PREFIXES) or upper.endswith(_PROTECTED_SUFFIXES)


@dataclass(frozen=True)
class EnvRefusal:
    """Why `trainer.env` may not be given: `name` is the variable (None when the whole object is wrong)."""

    name: str | None
    reason: str

    @property
    def field(self) -> str:
        return "trainer.env" if self.name is None else f"trainer.env.{self.name}"

    def __str__(self) -> str:
        return self.reason if self.name is None else f"{self.name}: {self.reason}"


class PolicyError(ValueError):
    """An allow-list setting that cannot be read."""


def parse_env_glob(text: str) -> str:
    """An `--allow-env` / HPO_ALLOWED_ENV pattern: a variable name, or a glob of one (`WANDB_*`)."""
    if not re.fullmatch(r"[A-Za-z0-9_*?\[\]!]{1,128}", text):
        raise PolicyError(f"--allow-env / {ENV_ENV}: {text!r} is not a variable name or a glob of one")
    return text


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
