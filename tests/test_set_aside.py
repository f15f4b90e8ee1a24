"""One job the policy cannot plan never stops the others (issue 36, items 18 and 20): a job that
cannot finish within the planning horizon even on its fastest option (1e-6 steps/s on 1e15
steps: 3e17 h), or one that finishes in microseconds (1e9 steps/s on 1,000 steps), is set aside
with a one-line note naming it and why, and every other job is still planned.

Before: ``plan`` ended with exit 4 for every job (min-cost-slo infeasible), ``plan --policy
max-throughput`` with an ``OverflowError`` traceback (the finish date), ``whatif`` with another
(its replay window), the microsecond job silently vanished from the plan, and the decision core
fell back to no targets for the whole fleet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotopt.decide.core import Memory, decide
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import enumerate_options, initial_state
from spotopt.jobspec import parse_jobs
from tests.test_decision_core import AT, snapshot

SPOTOPT = Path(sys.executable).parent / "spotopt"
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
HEALTHY = {"name": "example", "throughput": {"K80": 1.0, "V100": 2.4}, "work": {"steps": 20000}}
ENDLESS = {"name": "endless", "throughput": {"K80": 0.000001}, "work": {"steps": 1e15}}
INSTANT = {"name": "instant", "throughput": {"K80": 1e9}, "work": {"steps": 1000}}


def test_the_core_plans_the_others_and_places_the_set_aside_by_the_move_test() -> None:
    spec = parse_jobs({"jobs": [HEALTHY, ENDLESS, INSTANT]})
    markets = snapshot()
    state, opts = initial_state(spec, enumerate_options(spec, markets, AT), markets, AT)
    memory = Memory()
    moves = decide(state, opts, Guardrails(), memory)
    assert sorted(state.names[m.job] for m in moves) == ["endless", "example", "instant"]
    assert set(memory.target) == {"example"}  # the policy planned the healthy job
    notes = "\n".join(memory.notes)
    assert "job 'endless' set aside: it needs" in notes and "beyond the planning horizon" in notes
    assert "job 'instant' set aside: it finishes in" in notes
    assert "no policy solution" not in notes


def _write(tmp: Path, *jobs: str) -> Path:
    path = tmp / "jobs.yaml"
    body = {
        "example": "  - name: example\n    throughput: {L4: 40, A100: 100}\n    work: {steps: 2000}\n",
        "endless": "  - name: endless\n    throughput: {L4: 0.000001}\n    work: {steps: 1e15}\n",
        "instant": "  - name: instant\n    throughput: {L4: 1000000000}\n    work: {steps: 1000}\n",
    }
    path.write_text("jobs:\n" + "".join(body[j] for j in jobs), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def priced(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("set-aside")
    env = {**os.environ, "SPOTOPT_DB_URL": f"sqlite:///{tmp / 'h.sqlite'}", "XDG_DATA_HOME": str(tmp / "x")}
    _run(env, tmp, "import", "csv", str(EXAMPLES / "prices.csv"))
    return tmp, env


def _run(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(SPOTOPT), *args], env=env, cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, (args, done.stderr[-2000:])
    return done


@pytest.mark.parametrize("policy", ["min-cost-slo", "max-throughput"])
@pytest.mark.parametrize("bad", ["endless", "instant"])
def test_plan_sets_the_bad_job_aside_and_plans_the_other(
    priced: tuple[Path, dict[str, str]], policy: str, bad: str
) -> None:
    tmp, env = priced
    jobs = _write(tmp, "example", bad)
    done = _run(env, tmp, "plan", str(jobs), "--policy", policy, "--format", "json")
    doc = json.loads(done.stdout)
    ((name, allocation),) = [(j["name"], j["allocation"]) for j in doc["jobs"]]
    assert name == "example" and allocation
    (why,) = doc["set_aside"]
    assert why.startswith(f"job '{bad}' set aside: ")
    assert why in done.stderr  # said where a person reads it too, one line
    assert "Traceback" not in done.stderr


def test_a_plan_of_only_bad_jobs_says_why_in_one_line(priced: tuple[Path, dict[str, str]]) -> None:
    tmp, env = priced
    done = subprocess.run(
        [str(SPOTOPT), "plan", str(_write(tmp, "endless"))], env=env, cwd=tmp, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert "job 'endless' set aside" in done.stderr and "no job left to plan" in done.stderr


def test_a_daemon_round_places_the_healthy_job_and_names_the_bad_one(tmp_path: Path) -> None:
    env = {**os.environ, "SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'h.sqlite'}"}
    env["XDG_DATA_HOME"] = str(tmp_path / "x")
    _run(env, tmp_path, "import", "csv", str(EXAMPLES / "prices.csv"))
    for name, tput, steps in (("example", "{L4: 40}", "2000"), ("endless", "{L4: 0.000001}", "1e15")):
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(
            f"jobs:\n  - name: {name}\n    throughput: {tput}\n    work: {{steps: {steps}}}\n"
            f"    run: python train.py\n    checkpoint: {{uri: {tmp_path / name}}}\n    budget_usd: 5\n",
            encoding="utf-8",
        )
        _run(env, tmp_path, "jobs", "submit", str(spec))
    done = _run(env, tmp_path, "daemon", "run", "--once", "--dry-run", "--format", "json")
    assert "job 'endless' set aside: it needs" in done.stderr
    assert "example" in done.stdout and "start" in done.stdout
