"""rollout.max_staleness > 0 without vLLM: the sampler thread (engine/rollout/sampling_ahead.py) with stand-in
producers, the staleness bookkeeping (engine/rollout/staleness.py) with a stand-in server engine, and the config's
refusals. The vLLM leg runs the same code against real servers (tests/test_vllm_async.py)."""

import threading
import time

import pytest
import torch

from engine.rollout.engines import Responses, SamplingConfig
from engine.rollout.sampling_ahead import SamplerThread
from engine.rollout.single_turn import SingleTurnRollout
from engine.rollout.staleness import (
    UNKNOWN,
    VersionRecorder,
    row_versions,
    stale_groups,
    staleness_figures,
    synchronous_figures,
)


def _train(thread, steps, start=0, pause_s=0.0):
    """The trainer's side: take each step's batch, 'train', push (version step + 1); the staleness of each."""
    staleness = []
    for step in range(start, steps):
        batch, begun_at, _ = thread.take(step)
        assert batch == ("batch", step)
        staleness.append(step - begun_at)
        time.sleep(pause_s)
        thread.published(step + 1)
    return staleness


@pytest.mark.parametrize("bound", [1, 2, 3])
def test_the_thread_runs_ahead_by_the_bound_and_never_beyond(bound):
    began = {}  # step -> the trainer's version when produce() began it
    held = []  # batches waiting for the trainer when each produce() begins

    def produce(step):
        began[step] = thread.version
        held.append(len(thread.ready))
        return ("batch", step)

    thread = SamplerThread(produce, 0, 10, bound, version=0)
    thread.start()
    staleness = _train(thread, 10, pause_s=0.01)  # the trainer is the slow side: the thread waits at the bound
    assert thread.close()
    assert max(staleness) == bound  # it did run ahead (so the check below can fail)
    assert all(0 <= s <= bound for s in staleness), staleness
    assert all(step - version <= bound for step, version in began.items()), began
    assert max(held) <= bound  # at most `bound` batches sampled and not yet trained on
    assert staleness[:bound] == list(range(bound))  # the first steps begin at version 0


def test_a_resumed_thread_starts_at_the_checkpoints_version():
    began = {}

    def produce(step):
        began[step] = thread.version
        return ("batch", step)

    thread = SamplerThread(produce, 4, 8, 1, version=4)
    thread.start()
    staleness = _train(thread, 8, start=4, pause_s=0.01)
    assert staleness[0] == 0 and max(staleness) == 1, staleness
    assert sorted(began) == [4, 5, 6, 7] and began[4] == 4
    assert thread.close()


def test_the_thread_waits_at_the_bound_instead_of_sampling():
    produced = []
    thread = SamplerThread(lambda step: produced.append(step) or ("batch", step), 0, 10, 2, version=0).start()
    deadline = time.monotonic() + 5
    while len(produced) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    assert produced == [0, 1, 2]  # steps 0..k at version 0; step 3 waits for version 1
    thread.published(1)
    deadline = time.monotonic() + 5
    while len(produced) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert produced == [0, 1, 2, 3]
    assert thread.close(timeout_s=5)  # a thread waiting at the bound leaves at once
    assert not thread.thread.is_alive()


def test_an_error_in_the_thread_is_raised_by_take_and_ends_it():
    class DeadServer(RuntimeError):
        pass

    def produce(step):
        if step == 2:
            raise DeadServer("vLLM server http://127.0.0.1:9 is unreachable")
        return ("batch", step)

    thread = SamplerThread(produce, 0, 10, 2, version=0).start()
    assert thread.take(0)[0] == ("batch", 0)
    assert thread.take(1)[0] == ("batch", 1)
    with pytest.raises(DeadServer, match="127.0.0.1:9 is unreachable"):
        thread.take(2)
    thread.thread.join(5)
    assert not thread.thread.is_alive()


def test_close_stops_a_thread_in_the_middle_of_sampling():
    release = threading.Event()
    calls = []

    def produce(step):
        calls.append(step)
        release.wait(5)  # a request in flight
        return ("batch", step)

    thread = SamplerThread(produce, 0, 100, 50, version=0).start()
    while not calls:
        time.sleep(0.01)
    ended = [False]

    def closer():
        ended[0] = thread.close(timeout_s=5)

    closing = threading.Thread(target=closer)
    closing.start()
    time.sleep(0.1)
    release.set()  # the request in flight ends (e.g. its server was stopped)
    closing.join(10)
    assert ended[0] and calls == [0]  # no further batch begun after the stop


def test_busy_seconds_cover_the_window_and_a_sampling_still_running():
    clock = iter([10.0, 13.0, 20.0, 31.0]).__next__  # produce(0): 10 -> 13; produce(1): 20 -> 31
    hold = threading.Event()
    thread = SamplerThread(lambda step: hold.wait(5) if step == 1 else None, 0, 2, 5, version=0,
                           clock=clock).start()
    while thread.producing_since != 20.0:
        time.sleep(0.01)
    assert thread.busy_seconds(12.0, 25.0) == pytest.approx(1.0 + 5.0)
    assert thread.busy_seconds(25.0, 30.0) == pytest.approx(5.0)  # the interval before 25 was forgotten
    hold.set()
    assert thread.close()


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        SamplerThread(lambda step: None, 0, 1, -1, version=0)


# -- the bookkeeping, with a stand-in server engine ---------------------------------------------------------------


class StandInServer:
    """A server engine as the thread sees it: ``sample`` answers each prompt's n responses and their spans."""

    name = "stand-in"

    def __init__(self, spans_of_row):
        self.spans_of_row, self.seeds = spans_of_row, []

    def sample(self, prompts, sampling, seed):
        self.seeds.append(seed)
        rows = len(prompts) * sampling.n
        ids = torch.tensor([[7, 8, 9]] * rows)
        return (Responses(token_ids=ids, mask=torch.ones_like(ids), tokens_computed=3 * rows),
                [self.spans_of_row(row) for row in range(rows)])


class Tokenizer:
    pad_token_id = 0

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [[ord(c) % 50 + 1 for c in text] for text in texts]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i) + 60) for i in ids)


def _spans(*pieces):
    return [{"version": label, "start": start, "end": end} for label, start, end in pieces]


def test_the_recorder_keeps_each_rows_versions_and_seeds_from_its_generator():
    server = StandInServer(lambda row: _spans(("5", 0, 2), ("6", 2, 3)) if row == 1 else _spans(("5", 0, 3)))
    sampling = SamplingConfig(n=2, max_new_tokens=3, eos_token_ids=(1,))
    samples = [type("Sample", (), {"prompt": p}) for p in ("a x1:", "b x2:")]
    recorder = VersionRecorder(server, torch.Generator().manual_seed(3))
    torch.manual_seed(0)
    global_state = torch.get_rng_state()
    batch = SingleTurnRollout(Tokenizer())(recorder, samples, sampling)
    assert torch.equal(torch.get_rng_state(), global_state)  # the global generator is not touched
    again = VersionRecorder(server, torch.Generator().manual_seed(3))
    SingleTurnRollout(Tokenizer())(again, samples, sampling)
    assert server.seeds[0] == server.seeds[1]  # the same step's generator: the same requests
    assert len(batch) == 4 and len(recorder.spans) == 4
    oldest, newest = row_versions(recorder.spans, {"5": 3, "6": 4}, default=3)
    assert oldest.tolist() == [3, 3, 3, 3] and newest.tolist() == [3, 4, 3, 3]  # row 1 switched weights mid-way


def test_stale_groups_are_dropped_whole_and_counted():
    versions = {"default": 0, "7": 7, "8": 8}  # "3" was never pushed by this trainer (a restarted server)
    spans = [_spans(("8", 0, 4)), _spans(("7", 0, 2), ("8", 2, 4)),  # group 0: versions 7..8
             _spans(("3", 0, 4)), _spans(("8", 0, 4)),  # group 1: a label never pushed
             [], _spans(("7", 0, 1))]  # group 2: an empty response counts as the batch's begin version
    oldest, _ = row_versions(spans, versions, default=7)
    assert oldest.tolist() == [8, 7, UNKNOWN, 8, 7, 7]
    dropped = stale_groups(oldest, step=8, bound=1, group_size=2)
    assert dropped.tolist() == [False, False, True, True, False, False]
    lengths = torch.tensor([4, 4, 4, 3, 0, 1])
    sums, maxima = staleness_figures(oldest, 8, dropped, lengths)
    assert sums == {"staleness_sum": 3.0, "staleness_rows": 4.0, "dropped_stale": 2.0, "stale_tokens": 7.0}
    assert maxima == {"staleness_max": 1.0}
    tighter = stale_groups(oldest, step=8, bound=0, group_size=2)
    assert tighter.tolist() == [True] * 6  # every group has a row one version old
    assert staleness_figures(oldest, 8, tighter, lengths) == ({"staleness_sum": 0.0, "staleness_rows": 0.0,
                                                               "dropped_stale": 6.0, "stale_tokens": 16.0},
                                                              {"staleness_max": 0.0})
    assert synchronous_figures(5) == ({"staleness_sum": 0.0, "staleness_rows": 5.0, "dropped_stale": 0.0,
                                       "stale_tokens": 0.0}, {"staleness_max": 0.0})


# -- the config -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("options, expected", [
    (["rollout.max_staleness=-1"], "rollout.max_staleness must be an integer >= 0 (0: synchronous), got -1"),
    (["rollout.max_staleness=1"], "rollout.max_staleness=1 needs rollout.engine=vllm with rollout.vllm.mode=server "
                                  "(sampling in separate servers while the trainer trains); this run has "
                                  "rollout.engine=hf-continuous: set rollout.max_staleness=0 or use vLLM servers"),
    (["rollout.max_staleness=2", "rollout.engine=vllm"], "this run has rollout.engine=vllm with "
                                                          "rollout.vllm.mode=colocate"),
    (["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.mode=server", "algorithm.filter_groups=true"],
     "algorithm.filter_groups (dynamic sampling: every rank draws again until the step's groups are found, agreed "
     "through collectives) needs rollout.max_staleness=0, got 1"),
    (["rollout.max_staleness=1", "rollout.engine=vllm", "rollout.vllm.mode=server",
      "rollout.tools=[agent_tools:calculator]"],
     "multi-turn rollouts (rollout.tools / rollout.environment: the ranks' turns agree through collectives) need "
     "rollout.max_staleness=0, got 1"),
])
def test_staleness_settings_are_refused_in_one_line(options, expected):
    from engine.rl.ahead import staleness_problems
    from engine.rl.algorithms.grpo.config import build_config

    problems = staleness_problems(build_config(None, None, options))
    assert len(problems) == 1 and expected in problems[0], problems
    assert "\n" not in problems[0]


def test_values_of_the_wrong_type_are_refused_by_the_config_pipeline():
    from engine.rl.algorithms.grpo.config import build_config

    with pytest.raises(ValueError, match="rollout.partial must be true or false, got 'maybe'"):
        build_config(None, None, ["rollout.partial=maybe"])
    with pytest.raises(ValueError, match="rollout.max_staleness must be"):
        build_config(None, None, ["rollout.max_staleness=one"])


def test_the_defaults_are_synchronous_and_shown_in_the_config():
    from engine.rl.ahead import staleness_problems
    from engine.rl.algorithms.grpo.config import build_config

    config = build_config(None, None, [])
    assert (config.rollout.max_staleness, config.rollout.partial) == (0, False)
    assert staleness_problems(config) == []
    assert staleness_problems(build_config(None, None, ["rollout.max_staleness=2", "rollout.partial=true",
                                                        "rollout.engine=vllm", "rollout.vllm.mode=server"])) == []
