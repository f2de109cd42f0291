"""`hpo pipeline create|list|show` and `hpo round create|show|replicas|recipe|decide`: the
incremental tuning loop (docs/rounds.md) from the command line. An HTTP client, standard library
only; the server and token come as for `hpo study`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hpo.cli import CliError
from hpo.client import add_server_option, json_flag, read_spec, request
from hpo.tables import num, render_table

RECIPES = ("exploit", "steps", "instability", "warmup", "longer")


def register(subparsers: Any) -> None:
    """Adds `hpo pipeline` and `hpo round`."""
    pipeline = subparsers.add_parser(
        "pipeline",
        help="create, list and show pipelines: the baseline configuration and its launches",
        description="A pipeline is what rounds of tuning improve: its objective, trainer settings and baseline "
        "hyperparameters, and every launch that changed them (docs/rounds.md).",
    )
    commands = pipeline.add_subparsers(dest="pipeline_command", required=True, metavar="COMMAND")
    create = _command(commands, "create", "create a pipeline from a JSON file (docs/rounds.md)", _pipeline_create)
    create.add_argument("-f", "--file", required=True, help="the pipeline (JSON); - reads standard input")
    json_flag(create, "print the pipeline as JSON")
    listing = _command(commands, "list", "list pipelines, newest first", _pipeline_list)
    json_flag(listing, "print the page of pipelines as JSON")
    show = _command(commands, "show", "show a pipeline: baseline, launches and rounds", _pipeline_show)
    show.add_argument("pipeline_id", type=int, help="the pipeline's id")
    json_flag(show, "print the pipeline as JSON")

    rounds = subparsers.add_parser(
        "round",
        help="create, show, replicate, run recipes on and decide rounds of tuning",
        description="A round has one goal, its studies (specs naming round_id), a candidate, the evidence against "
        "the baseline and a decision (docs/rounds.md).",
    )
    commands = rounds.add_subparsers(dest="round_command", required=True, metavar="COMMAND")
    create = _command(commands, "create", "open the next round of a pipeline with one goal", _round_create)
    create.add_argument("pipeline_id", type=int, help="the pipeline's id")
    create.add_argument("--goal", required=True, help="the round's one goal, in words")
    create.add_argument(
        "--kind",
        choices=("improve", "understand", "exploit"),
        default="improve",
        help="the round's kind (default improve)",
    )
    json_flag(create, "print the round as JSON")
    show = _command(commands, "show", "show a round: studies, candidate, evidence, recipes, decision", _round_show)
    show.add_argument("round_id", type=int, help="the round's id")
    json_flag(show, "print the round as JSON")
    replicas = _command(
        commands, "replicas", "run the candidate and the baseline again with new seeds (trial variance)", _replicas
    )
    replicas.add_argument("round_id", type=int, help="the round's id")
    replicas.add_argument("--count", type=int, required=True, help="new seeds of each, 1 to 100")
    json_flag(replicas, "print the new trial ids as JSON")
    recipe = _command(commands, "recipe", "create a round's study from a recipe (docs/rounds.md, Recipes)", _recipe)
    recipe.add_argument("round_id", type=int, help="the round's id")
    recipe.add_argument("kind", choices=RECIPES, help="the recipe")
    recipe.add_argument("--study", type=int, help="the earlier study of the round the recipe starts from")
    recipe.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe option, the value as JSON; repeatable (default: none)",
    )
    recipe.add_argument("--dry-run", action="store_true", help="print the study spec it would create; create nothing")
    recipe.add_argument("-f", "--file", help="run this (edited) study spec instead of the recipe's own (JSON)")
    json_flag(recipe, "print the answer as JSON")
    decide = _command(commands, "decide", "record the round's decision; adopting moves the baseline", _decide)
    decide.add_argument("round_id", type=int, help="the round's id")
    choice = decide.add_mutually_exclusive_group(required=True)
    choice.add_argument("--adopt", action="store_true", help="launch the candidate as the new baseline")
    choice.add_argument("--reject", action="store_true", help="keep the baseline")
    decide.add_argument("--note", default="", help="why (needed with --override; default: empty)")
    decide.add_argument("--override", action="store_true", help="adopt although the verdict is not 'better'")
    json_flag(decide, "print the decided round as JSON")


def _command(commands: Any, name: str, help_text: str, handler: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text)
    add_server_option(parser)
    parser.set_defaults(handler=handler)
    return parser


def _print_json(value: Any) -> int:
    print(json.dumps(value, indent=2))
    return 0


# --- pipelines -------------------------------------------------------------------------------------


def _pipeline_create(args: argparse.Namespace) -> int:
    pipeline = request(args, "POST", "/api/v1/pipelines", read_spec(args.file))
    if args.json:
        return _print_json(pipeline)
    print(
        f"created pipeline {pipeline['id']} {pipeline['name']!r}; "
        f"open a round with `hpo round create {pipeline['id']} --goal ...`"
    )
    return 0


def _pipeline_list(args: argparse.Namespace) -> int:
    page = request(args, "GET", "/api/v1/pipelines")
    if args.json:
        return _print_json(page)
    if not page["items"]:
        print("no pipelines; create one with `hpo pipeline create -f pipeline.json`")
        return 0
    rows = [
        [
            str(p["id"]),
            p["name"],
            f"{p['objective']['mode']} {p['objective']['metric']}",
            str(p["round_count"]),
            str(p["launch_count"]),
            num((p["baseline"]["objective"] or {}).get("mean")),
        ]
        for p in page["items"]
    ]
    print(render_table(rows, ("id", "name", "objective", "rounds", "launches", "baseline mean")))
    return 0


def _pipeline_show(args: argparse.Namespace) -> int:
    p = request(args, "GET", f"/api/v1/pipelines/{args.pipeline_id}")
    if args.json:
        return _print_json(p)
    print(f"pipeline {p['id']} {p['name']!r} ({p['objective']['mode']} {p['objective']['metric']})")
    if p.get("description"):
        print(f"  {p['description']}")
    baseline = p["baseline"]
    print(f"  baseline: {_params(baseline['params'])}")
    print(f"  baseline objective: {_measure(baseline['objective'])}")
    print()
    if p["launches"]:
        rows = [
            [
                str(i),
                str(x["round_id"]),
                str(x["trial_id"] or "-"),
                _changes(x["params_changed"]),
                _measure(x["objective_before"]),
                _measure(x["objective_after"]),
                x["evidence"].get("verdict", "-"),
            ]
            for i, x in enumerate(p["launches"], 1)
        ]
        print(render_table(rows, ("launch", "round", "trial", "changed", "before", "after", "verdict")))
    else:
        print("no launches yet")
    print()
    rows = [
        [str(r["id"]), str(r["number"]), r["kind"], r["status"], _decision(r["decision"]), r["goal"]]
        for r in p["rounds"]
    ]
    print(render_table(rows, ("round", "number", "kind", "status", "decision", "goal")) if rows else "no rounds yet")
    return 0


# --- rounds ----------------------------------------------------------------------------------------


def _round_create(args: argparse.Namespace) -> int:
    body = {"goal": args.goal, "kind": args.kind}
    r = request(args, "POST", f"/api/v1/pipelines/{args.pipeline_id}/rounds", body)
    if args.json:
        return _print_json(r)
    print(f"opened round {r['id']} (number {r['number']} of pipeline {r['pipeline_id']}): {r['goal']}")
    print(f'  studies join it with "round_id": {r["id"]} in their spec')
    return 0


def _round_show(args: argparse.Namespace) -> int:
    r = request(args, "GET", f"/api/v1/rounds/{args.round_id}")
    if args.json:
        return _print_json(r)
    print(f"round {r['id']} (number {r['number']} of pipeline {r['pipeline']['name']!r}) [{r['status']}] {r['kind']}")
    print(f"  goal: {r['goal']}")
    for s in r["studies"]:
        print(f"  study {s['id']} {s['name']!r} [{s['status']}] best {num(s['best_value'])}")
    candidate = r["candidate"]
    if candidate:
        print(
            f"  candidate: trial {candidate['trial_id']} (study {candidate['study_id']}) "
            f"= {num(candidate['objective'])}"
        )
        changed = {k: v for k, v in candidate["params"].items() if r["pipeline"]["baseline_params"].get(k) != v}
        print(f"    differs from the baseline in: {_params(changed) or 'nothing'}")
    ev = r["evidence"]
    print(f"  verdict: {ev['verdict']}: {ev['message']}")
    if candidate:
        for side in ("candidate", "baseline"):
            s = ev[side]
            print(
                f"    {side}: mean {num(s['mean'])} ± {num(s['std'])} over {s['n']} runs, {s['diverged']} diverged, "
                f"{s['pending']} pending"
            )
    for recipe in r.get("recipes") or []:
        readout = recipe.get("readout") or {}
        print(f"  recipe {recipe['kind']} (study {recipe['study_id']}): {readout.get('message', 'running')}")
    if r["decision"]:
        print(f"  decision: {_decision(r['decision'])} {r['decision'].get('note') or ''}".rstrip())
    return 0


def _replicas(args: argparse.Namespace) -> int:
    made = request(args, "POST", f"/api/v1/rounds/{args.round_id}/replicas", {"count": args.count})
    if args.json:
        return _print_json(made)
    print(
        f"round {args.round_id}: {len(made['candidate_replica_ids'])} runs of the candidate (trial "
        f"{made['candidate_trial_id']}) and {len(made['baseline_trial_ids'])} of the baseline "
        f"(study {made['baseline_study_id']}) queued"
    )
    return 0


def _recipe(args: argparse.Namespace) -> int:

    options: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--set takes KEY=VALUE, not {item!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    body: dict[str, Any] = {"options": options}
    if args.study is not None:
        body["study_id"] = args.study
    if args.file:
        body["spec"] = read_spec(args.file)
    query = "?dry_run=true" if args.dry_run else ""
    answer = request(args, "POST", f"/api/v1/rounds/{args.round_id}/recipes/{args.kind}", body, params=query)
    if args.json or args.dry_run:
        return _print_json(answer["spec"] if args.dry_run and not args.json else answer)
    study = answer["study"]
    print(f"recipe {args.kind}: created study {study['id']} {study['name']!r} in round {args.round_id}")
    for note in answer.get("notes") or []:
        print(f"  {note}")
    return 0


def _decide(args: argparse.Namespace) -> int:
    body = {"adopt": bool(args.adopt), "note": args.note, "override": bool(args.override)}
    r = request(args, "POST", f"/api/v1/rounds/{args.round_id}/decision", body)
    if args.json:
        return _print_json(r)
    print(f"round {r['id']}: {_decision(r['decision'])}")
    if r.get("launch"):
        print(f"  launched trial {r['launch']['trial_id']}: {_changes(r['launch']['params_changed'])}")
    return 0


# --- formatting ------------------------------------------------------------------------------------


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={num(v)}" for k, v in sorted(params.items()))


def _changes(changed: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{k} {num(v['before'])} -> {num(v['after'])}" for k, v in sorted(changed.items())) or "-"


def _measure(objective: dict[str, Any] | None) -> str:
    if not objective or objective.get("mean") is None:
        return "unmeasured" if not objective or objective.get("value") is None else num(objective["value"])
    return f"{num(objective['mean'])} ± {num(objective.get('std'))} (n={objective.get('n')})"


def _decision(decision: dict[str, Any] | None) -> str:
    if not decision:
        return "-"
    what = "adopted" if decision["adopt"] else "kept the baseline"
    return f"{what} (verdict {decision['verdict']}{', override' if decision.get('override') else ''})"
