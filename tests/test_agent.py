"""The agent in-process: configuration, triggers, control requests, fencing, notices, heartbeats."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotopt.agent import ENV_VARS, EXIT_STOPPED, EXIT_SUPERSEDED, Agent, AgentConfig, young_daly_s
from spotopt.agent.core import EXIT_UNSAVED, STORE_RETRY_FIRST_S
from spotopt.agent.notices import detect_cloud, poller_for
from spotopt.checkpoints import (
    AgentState,
    Location,
    RequestKind,
    grant_lease,
    list_checkpoints,
    read_acknowledgement,
    read_finished,
    read_heartbeat,
    send_request,
)
from spotopt.clouds.aws.notices import AwsImdsPoller
from spotopt.clouds.azure.notices import AzureScheduledEventsPoller
from spotopt.clouds.common.notices import NoticeKind
from spotopt.clouds.gcp.notices import GcpMetadataPoller
from spotopt.errors import ConfigError
from tests.fake_metadata import FakeMetadata, metadata
from tests.read_only import allow_writes, refuse_writes

__all__ = ["metadata"]

T0 = datetime(2026, 11, 1, tzinfo=UTC).timestamp()


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _config(tmp_path: Path, **env: str) -> AgentConfig:
    base = {
        "SPOTOPT_JOB": "job",
        "SPOTOPT_EPOCH": "1",
        "SPOTOPT_CHECKPOINT_URI": f"file://{tmp_path / 'store'}",
        "SPOTOPT_CLOUD": "none",
        "SPOTOPT_SCRATCH_DIR": str(tmp_path / "scratch"),
    }
    return AgentConfig.from_environ({**base, **env})


def _agent(tmp_path: Path, clock: FakeClock, **env: str) -> Agent:
    """An agent without its background thread: the test drives ``poll_once`` itself."""
    return Agent(_config(tmp_path, **env), clock=clock, warn=lambda _m: None, background=False)


def _save(agent: Agent, step: int) -> None:
    with agent.checkpoint(step) as d:
        (d / "state").write_text(str(step))


@pytest.fixture(autouse=True)
def _keep_sigterm() -> Iterator[None]:
    """Agents built here install their SIGTERM handler in the test process: put the old one back."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def loc(tmp_path: Path) -> Location:
    loc = Location(f"file://{tmp_path / 'store'}")
    grant_lease(loc, "job", datetime.fromtimestamp(T0, UTC))  # epoch 1, as a daemon would
    return loc


def test_importing_the_agent_is_light_and_fast() -> None:
    code = (
        "import sys, time; t = time.process_time(); import spotopt.agent; took = time.process_time() - t\n"
        "heavy = {'sqlalchemy', 'cvxpy', 'pandas', 'numpy', 'rich', 'typer', 'fsspec', 'boto3', 'botocore',"
        " 's3fs', 'gcsfs', 'adlfs', 'google', 'azure', 'pydantic', 'yaml', 'scipy'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy), took)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split(" ")
    assert out[0] == "[]", f"spotopt.agent imported {out[0]}"
    assert float(out[1]) < 0.3  # CPU seconds: wall time on a shared 2-core machine measures the neighbours


def test_without_environment_the_agent_is_standalone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/somewhere/train model.py"])
    config = AgentConfig.from_environ({})
    assert (config.job, config.epoch, config.managed) == ("train-model", 0, False)
    assert config.checkpoint_uri == str(tmp_path / "spotopt-checkpoints")
    agent = Agent(config, warn=lambda _m: None)
    assert agent.resume() is None and agent.start_step() == 0
    agent.progress(5)
    _save(agent, 5)
    agent.finish()
    assert agent._thread is None  # nothing runs in the background
    assert [c.step for c in list_checkpoints(Location(config.checkpoint_uri), "train-model")] == [5]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("SPOTOPT_CHECKPOINT_EVERY", "soon", "SPOTOPT_CHECKPOINT_EVERY: 'soon' is not a duration"),
        ("SPOTOPT_EPOCH", "two", "SPOTOPT_EPOCH: 'two' is not an integer"),
        ("SPOTOPT_CLOUD", "ibm", "SPOTOPT_CLOUD: 'ibm' is not one of"),
        ("SPOTOPT_STORAGE_OPTIONS", "{bad", "SPOTOPT_STORAGE_OPTIONS: not JSON"),
        ("SPOTOPT_JOB", "a/b", "SPOTOPT_JOB: 'a/b' is not a job name"),
        ("SPOTOPT_PREEMPTIONS_PER_HOUR", "-1", "SPOTOPT_PREEMPTIONS_PER_HOUR: '-1' must be"),
    ],
)
def test_bad_environment_names_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AgentConfig.from_environ({name: value})


def test_the_period_is_young_daly_with_the_measured_checkpoint_time(tmp_path: Path, clock: FakeClock) -> None:
    agent = _agent(tmp_path, clock, SPOTOPT_PREEMPTIONS_PER_HOUR="0.5", SPOTOPT_CHECKPOINT_S="20")
    assert agent.period_s() == pytest.approx(math.sqrt(2 * 20 * 7200)) == young_daly_s(20, 0.5)
    with agent.checkpoint(1) as d:
        (d / "state").write_text("1")
        clock.now += 5  # this job's checkpoints take 5 s on this store
    assert agent.period_s() == pytest.approx(math.sqrt(2 * 5 * 7200))
    assert young_daly_s(5, 0) == math.inf


def test_the_periodic_trigger_follows_the_injected_clock(tmp_path: Path, clock: FakeClock) -> None:
    agent = _agent(tmp_path, clock, SPOTOPT_CHECKPOINT_EVERY="30s")
    agent.resume()
    agent.progress(1)
    assert not agent.should_checkpoint()
    clock.now += 29.9
    assert not agent.should_checkpoint()
    clock.now += 0.1
    assert agent.should_checkpoint()
    _save(agent, 1)
    assert not agent.should_checkpoint()  # nothing new since
    agent.progress(2)
    assert not agent.should_checkpoint()  # the period restarts at the checkpoint


def test_a_daemon_checkpoint_and_stop_request_is_answered_and_acknowledged(
    tmp_path: Path, clock: FakeClock, loc: Location
) -> None:
    agent = _agent(tmp_path, clock)
    agent.resume()
    agent.progress(3)
    request = send_request(loc, "job", 1, RequestKind.CHECKPOINT_AND_STOP, datetime.fromtimestamp(T0, UTC))
    other = send_request(loc, "job", 2, RequestKind.CHECKPOINT_AND_STOP, datetime.fromtimestamp(T0, UTC))
    assert not agent.should_checkpoint() and not agent.should_stop()
    agent.poll_once()
    assert agent.should_checkpoint() and not agent.should_stop()
    _save(agent, 3)
    assert agent.should_stop() and not agent.should_checkpoint()
    ack = read_acknowledgement(loc, "job", request.id)
    assert ack is not None and ack.step == 3 and ack.checkpoint == agent.last_checkpoint.name  # type: ignore[union-attr]
    assert read_acknowledgement(loc, "job", other.id) is None  # another epoch's request
    with pytest.raises(SystemExit) as stopped:
        agent.finish()
    assert stopped.value.code == EXIT_STOPPED
    assert read_finished(loc, "job") is None
    beat = read_heartbeat(loc, "job", 1)
    assert (
        beat is not None and beat.state is AgentState.STOPPED and "checkpoint-and-stop" in (beat.reason or "")
    )


def test_a_checkpoint_request_keeps_training(tmp_path: Path, clock: FakeClock, loc: Location) -> None:
    agent = _agent(tmp_path, clock)
    agent.resume()
    agent.progress(1)
    request = send_request(loc, "job", 1, RequestKind.CHECKPOINT, datetime.fromtimestamp(T0, UTC))
    agent.poll_once()
    assert agent.should_checkpoint()
    _save(agent, 1)
    assert not agent.should_stop()
    assert read_acknowledgement(loc, "job", request.id) is not None
    agent.poll_once()
    assert not agent.should_checkpoint()  # acknowledged requests are not answered twice


def test_sigterm_right_after_a_checkpoint_stops_without_another(tmp_path: Path, clock: FakeClock) -> None:
    agent = _agent(tmp_path, clock)
    agent.resume()
    agent.progress(4)
    _save(agent, 4)
    agent.request_stop("SIGTERM")
    assert not agent.should_checkpoint()
    assert agent.should_stop()


def test_a_superseded_agent_writes_nothing_and_exits_with_a_message(
    tmp_path: Path, clock: FakeClock, loc: Location
) -> None:
    messages: list[str] = []
    agent = Agent(_config(tmp_path), clock=clock, warn=messages.append, background=False)
    agent.resume()
    agent.progress(2)
    _save(agent, 2)
    grant_lease(loc, "job", datetime.fromtimestamp(T0 + 60, UTC))  # the daemon moved the job: epoch 2
    before = [c.name for c in list_checkpoints(loc, "job")]
    agent.progress(3)
    agent.poll_once()
    assert agent.should_stop() and not agent.should_checkpoint()
    with pytest.raises(SystemExit) as exited, agent.checkpoint(3) as d:
        (d / "state").write_text("3")
    assert exited.value.code == EXIT_SUPERSEDED
    with pytest.raises(SystemExit):
        agent.finish()
    assert [c.name for c in list_checkpoints(loc, "job")] == before
    assert read_finished(loc, "job") is None
    assert "epoch 1 is not the lease holder (lease epoch 2" in messages[-1]
    late = Agent(_config(tmp_path), clock=clock, warn=messages.append)  # epoch 1 starting late
    with pytest.raises(SystemExit):
        late.resume()


def test_finish_marks_the_job_complete_and_heartbeats_carry_steps_per_second(
    tmp_path: Path, clock: FakeClock, loc: Location
) -> None:
    agent = _agent(tmp_path, clock, SPOTOPT_HEARTBEAT_EVERY="10s")
    agent.resume()
    agent.poll_once()
    clock.now += 10
    agent.progress(50)
    agent.poll_once()  # this interval holds the warm-up: no rate (tests/test_throughput_profile.py)
    clock.now += 10
    agent.progress(100)
    agent.poll_once()
    beat = read_heartbeat(loc, "job", 1)
    assert beat is not None and beat.step == 100 and beat.steps_per_s == pytest.approx(5.0)
    assert beat.state is AgentState.RUNNING and beat.at == datetime.fromtimestamp(clock.now, UTC)
    _save(agent, 100)
    agent.finish()
    done = read_finished(loc, "job")
    assert done is not None and done["step"] == 100 and done["checkpoint"] == agent.last_checkpoint.name  # type: ignore[union-attr]
    assert read_heartbeat(loc, "job", 1).state is AgentState.FINISHED  # type: ignore[union-attr]


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_each_cloud_poller_sees_its_notice(metadata: FakeMetadata, cloud: str) -> None:
    pollers = {"aws": AwsImdsPoller, "gcp": GcpMetadataPoller, "azure": AzureScheduledEventsPoller}
    poller = pollers[cloud](metadata.url)
    assert poller.poll() is None
    metadata.notify(cloud)
    notice = poller.poll()
    assert notice is not None and (notice.cloud, notice.kind) == (cloud, NoticeKind.PREEMPT)


def test_the_aws_poller_uses_imdsv2_and_sees_the_rebalance_recommendation(metadata: FakeMetadata) -> None:
    poller = AwsImdsPoller(metadata.url)
    metadata.aws_rebalance = {"noticeTime": "2026-11-21T08:22:00Z"}
    notice = poller.poll()
    assert notice is not None and notice.kind is NoticeKind.REBALANCE and "08:22" in notice.detail
    assert metadata.requests[0] == "PUT /latest/api/token"
    assert sum(r.startswith("PUT") for r in metadata.requests) == 1  # the token is reused


def test_only_the_configured_or_detected_clouds_poller_runs(tmp_path: Path) -> None:
    dmi = tmp_path / "dmi"
    dmi.mkdir()
    assert detect_cloud(dmi) is None
    (dmi / "sys_vendor").write_text("Amazon EC2\n")
    assert detect_cloud(dmi) == "aws"
    assert isinstance(poller_for(AgentConfig.from_environ({"SPOTOPT_JOB": "j"}), dmi), AwsImdsPoller)
    gcp = poller_for(
        AgentConfig.from_environ({"SPOTOPT_CLOUD": "gcp", "SPOTOPT_GCP_METADATA_URL": "http://127.0.0.1:9"}),
        dmi,
    )
    assert isinstance(gcp, GcpMetadataPoller) and gcp.url.startswith("http://127.0.0.1:9/")
    assert poller_for(AgentConfig.from_environ({"SPOTOPT_CLOUD": "none"}), dmi) is None


def test_an_agent_polls_the_notice_and_stops_after_saving(
    tmp_path: Path, clock: FakeClock, loc: Location, metadata: FakeMetadata
) -> None:
    agent = _agent(tmp_path, clock, SPOTOPT_CLOUD="azure", SPOTOPT_AZURE_METADATA_URL=metadata.url)
    agent.resume()
    agent.progress(7)
    agent.poll_once()
    assert not agent.should_checkpoint()
    metadata.notify("azure")
    agent.poll_once()
    assert agent.should_checkpoint()
    _save(agent, 7)
    assert agent.should_stop() and "azure preempt notice" in (agent.stop_reason or "")


def test_every_variable_the_agent_reads_is_listed_for_the_docs() -> None:
    import re

    import spotopt.agent.config as config_module

    source = Path(config_module.__file__).read_text()
    assert set(re.findall(r'"(SPOTOPT_[A-Z_]+)"', source)) <= set(ENV_VARS)


def test_the_module_api_reads_the_injected_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import spotopt.agent as agent_module

    monkeypatch.setattr(agent_module, "_agent", None)
    monkeypatch.setattr(agent_module, "_clock", agent_module._clock)
    monkeypatch.setenv("SPOTOPT_CHECKPOINT_URI", str(tmp_path / "store"))
    monkeypatch.setenv("SPOTOPT_CHECKPOINT_EVERY", "60s")
    clock = FakeClock()
    agent_module.set_clock(clock)
    assert agent_module.resume() is None and agent_module.start_step() == 0
    agent_module.progress(1)
    assert not agent_module.should_checkpoint()
    clock.now += 60
    assert agent_module.should_checkpoint()
    with agent_module.checkpoint(1) as d:
        (d / "w").write_text("1")
    assert not agent_module.should_stop()
    agent_module.finish()
    done = read_finished(Location(str(tmp_path / "store")), agent_module.current().config.job)
    assert done is not None and done["finished_at"] == datetime.fromtimestamp(clock.now, UTC).isoformat()


class BrokenPoller:
    """A metadata service that fails every poll (an IMDSv2 token PUT timing out in a container)."""

    cloud = "aws"

    def __init__(self) -> None:
        self.polls = 0

    def poll(self) -> None:
        self.polls += 1
        raise TimeoutError("timed out")


def test_a_failing_notice_poll_does_not_stop_the_round(
    tmp_path: Path, clock: FakeClock, loc: Location
) -> None:
    """Lease, control requests and heartbeat still run when the notice poller raises, and the
    failure is said once a minute, not every round (issue 21, finding 12)."""
    warned: list[str] = []
    poller = BrokenPoller()
    agent = Agent(_config(tmp_path), clock=clock, warn=warned.append, poller=poller, background=False)  # type: ignore[arg-type]
    agent.resume()
    agent.progress(3)
    send_request(loc, "job", 1, RequestKind.CHECKPOINT_AND_STOP, datetime.fromtimestamp(T0, UTC))
    agent.poll_once()
    assert agent.should_checkpoint()  # the daemon's request was read
    beat = read_heartbeat(loc, "job", 1)
    assert beat is not None and beat.step == 3
    for _ in range(5):
        clock.now += 1
        agent.poll_once()
    clock.now += 60
    agent.poll_once()
    failures = [w for w in warned if "notice poll failed (TimeoutError: timed out)" in w]
    assert poller.polls == 7 and len(failures) == 2


@pytest.fixture
def refused(loc: Location) -> Iterator[Path]:
    """The job's checkpoint directory, refusing writes until the test allows them again."""
    checkpoints = Path(loc.path("job", "checkpoints"))
    checkpoints.mkdir(parents=True, exist_ok=True)
    refuse_writes(checkpoints)
    yield checkpoints
    allow_writes(checkpoints)


def test_a_refused_checkpoint_keeps_training_and_is_tried_again_after_a_backoff(
    tmp_path: Path, clock: FakeClock, loc: Location, refused: Path
) -> None:
    """A store that refuses the checkpoint a daemon asked for (issue 21: an error writing a
    checkpoint made the job fail for good): the script goes on, the request stays pending, the
    next try waits the backoff, and once the store takes writes the stop is answered."""
    warned: list[str] = []
    agent = Agent(_config(tmp_path), clock=clock, warn=warned.append, background=False)
    agent.resume()
    agent.progress(3)
    request = send_request(loc, "job", 1, RequestKind.CHECKPOINT_AND_STOP, datetime.fromtimestamp(T0, UTC))
    agent.poll_once()
    _save(agent, 3)  # no exception reaches the training script
    assert agent.last_checkpoint is None and list_checkpoints(loc, "job") == []
    assert "checkpoint at step 3 not saved (PermissionError" in warned[-1]
    assert not agent.should_stop() and not agent.should_checkpoint()  # backing off
    clock.now += STORE_RETRY_FIRST_S
    assert agent.should_checkpoint()  # the request is still pending
    _save(agent, 3)
    assert "trying the store again in 2 s" in warned[-1]  # the backoff doubled
    clock.now += 2 * STORE_RETRY_FIRST_S
    allow_writes(refused)
    assert agent.should_checkpoint()
    _save(agent, 3)
    assert agent.last_checkpoint is not None and agent.last_checkpoint.step == 3
    assert agent.should_stop()
    ack = read_acknowledgement(loc, "job", request.id)
    assert ack is not None and ack.step == 3


def test_a_run_whose_last_checkpoint_was_refused_is_not_marked_complete(
    tmp_path: Path, clock: FakeClock, loc: Location, refused: Path
) -> None:
    agent = _agent(tmp_path, clock)
    agent.resume()
    agent.progress(5)
    _save(agent, 5)
    with pytest.raises(SystemExit) as exited:
        agent.finish()
    assert exited.value.code == EXIT_UNSAVED  # retried by the daemon, not final
    assert read_finished(loc, "job") is None


def test_a_refused_second_checkpoint_of_a_saved_step_still_finishes(
    tmp_path: Path, clock: FakeClock, loc: Location
) -> None:
    agent = _agent(tmp_path, clock)
    agent.resume()
    agent.progress(5)
    _save(agent, 5)
    checkpoints = Path(loc.path("job", "checkpoints"))
    refuse_writes(checkpoints)
    try:
        _save(agent, 5)  # refused, but step 5 is already verified
        agent.finish()
    finally:
        allow_writes(checkpoints)
    done = read_finished(loc, "job")
    assert done is not None and done["step"] == 5
