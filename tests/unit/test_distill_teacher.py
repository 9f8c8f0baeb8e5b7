"""The distillation teacher's pieces, in this process: the tokenizer check (same vocabulary and special ids, or one
sentence saying what differs), the served teacher's log-probs (``engine/rl/server_logprobs.py``) against an HTTP
server answering vLLM's ``/v1/completions`` prompt log-probs from a real model (this rank's rows only, in order,
whatever order the choices come back in; the real vLLM server is the vLLM leg's), the served teacher's refusals,
and the reverse-KL term: each token's advantage is ``coef x (r - group mean) - (log p_student - log p_teacher)``
and its gradient is the policy gradient of that advantage."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch
from distill_models import char_model_dir

from engine.rl.algorithms.distill.teacher import tokenizer_problem


def _tokenizer(alphabet=None):
    from engine.rl.prompts import EchoTask
    from engine.rl.tokenizer import build_char_tokenizer

    return build_char_tokenizer(alphabet or EchoTask.alphabet)


def test_the_tokenizer_check_names_what_differs():
    assert tokenizer_problem(_tokenizer(), _tokenizer(), "t") is None
    problem = tokenizer_problem(_tokenizer(), _tokenizer("zyxabcdefgh 0123456789:"), "/models/t")
    assert problem.startswith("the teacher's tokenizer (/models/t) differs from the student's") and "\n" not in problem


class _Served:
    """A stand-in for vLLM's HTTP routes: prompt log-probs of a real model, choices in reverse order."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer, self.requests = model, tokenizer, []

    def answer(self, path, body):
        if path == "/v1/models":
            return {"data": [{"id": "teacher", "root": "/models/teacher", "max_model_len": 128}]}
        if path == "/tokenize":
            return {"tokens": self.tokenizer(body["prompt"], add_special_tokens=False)["input_ids"]}
        self.requests.append(body)
        assert body["prompt_logprobs"] == 0 and body["max_tokens"] == 1 and body["model"] == "teacher"
        choices = []
        for index, ids in enumerate(body["prompt"]):
            with torch.no_grad():
                logits = self.model(torch.tensor([ids])).logits[0].log_softmax(-1)
            entries = [None] + [{str(ids[p]): {"logprob": float(logits[p - 1, ids[p]]), "rank": 1}}
                                for p in range(1, len(ids))]
            choices.append({"index": index, "text": "x", "prompt_logprobs": entries})
        return {"choices": choices[::-1]}


@pytest.fixture
def served(tmp_path):
    from transformers import AutoModelForCausalLM

    directory = char_model_dir(tmp_path / "teacher", seed=3, sharpness=3.0)
    state = _Served(AutoModelForCausalLM.from_pretrained(directory).eval(), _tokenizer())

    class Handler(BaseHTTPRequestHandler):
        def _reply(self, body):
            data = json.dumps(state.answer(self.path, body)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's name
            self._reply({})

        def do_POST(self):  # noqa: N802
            self._reply(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield SimpleNamespace(url=f"http://127.0.0.1:{server.server_port}", state=state)
    server.shutdown()


def _step_data(rank: int):
    """A real step batch of 6 sequences planned over 2 ranks (prompt 2-3 tokens, response 1-4)."""
    from engine.packing import SequenceBatch
    from engine.rl.batches import Batching, StepData, plan_updates

    generator = torch.Generator().manual_seed(0)
    starts = torch.tensor([2, 3, 2, 3, 2, 2])
    lengths = starts + torch.tensor([4, 1, 3, 2, 4, 2])
    tokens = torch.zeros(6, int(lengths.max()), dtype=torch.long)
    for row, length in enumerate(lengths.tolist()):
        tokens[row, :length] = torch.randint(4, 20, (length,), generator=generator)
    sequences = SequenceBatch(tokens, lengths, starts)
    mask = (torch.arange(4).unsqueeze(0) < (lengths - starts).unsqueeze(1)).long()
    plan = plan_updates(sequences, Batching(6, 2, None, 2, True), world_size=2)
    return StepData(sequences, mask, torch.zeros(6), plan, rank, True)


def test_a_served_teacher_gives_the_log_probs_of_this_ranks_rows(served):
    from engine.rl.server_logprobs import ServerFrozenModel

    teacher = ServerFrozenModel("teacher", served.url)
    assert teacher.model == "teacher" and teacher.engine is None
    data = _step_data(rank=1)
    got = teacher.log_probs(data, rollout=None)
    own = data.own_rows()
    assert 0 < len(own) < 6 and served.state.requests
    for row in range(6):
        s, length = int(data.sequences.starts[row]), int(data.sequences.lengths[row])
        if row not in own:
            assert not got[row].any()
            continue
        ids = data.sequences.tokens[row, :length]
        with torch.no_grad():
            want = served.state.model(ids.unsqueeze(0)).logits[0].log_softmax(-1)
        expected = torch.stack([want[p - 1, ids[p]] for p in range(s, length)])
        assert torch.allclose(got[row, :length - s], expected, atol=1e-6) and not got[row, length - s:].any()


def test_a_served_teacher_is_refused_for_other_sampling_or_another_tokenizer(served):
    from engine.rl.algorithms.distill.teacher import TeacherConfig
    from engine.rl.server_logprobs import server_problems

    teacher = TeacherConfig(server_url=served.url)
    plain = SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0)
    assert server_problems(teacher, plain, _tokenizer()) == []
    (problem,) = server_problems(teacher, SimpleNamespace(temperature=0.7, top_k=0, top_p=1.0), _tokenizer())
    assert "rollout.temperature=0.7" in problem and "teacher.path=MODEL_DIR" in problem
    (problem,) = server_problems(teacher, plain, _tokenizer("zyxabcdefgh 0123456789:"))
    assert "differs from the student's" in problem
    (problem,) = server_problems(TeacherConfig(server_url=served.url, server_model="other"), plain, _tokenizer())
    assert "'other' is not served" in problem
    (problem,) = server_problems(TeacherConfig(server_url="http://127.0.0.1:9"), plain, _tokenizer())
    assert problem.startswith("teacher.server_url: vLLM server http://127.0.0.1:9 is unreachable")


def test_the_reverse_kl_term_is_the_policy_gradient_of_the_teachers_gap():
    from engine.rl.algorithms.distill.algorithm import reverse_kl_policy_gradient
    from engine.rl.terms import Norm, Streams, micro_batch_loss

    generator = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    student = -torch.rand(2, 4, generator=generator) * 3
    teacher = -torch.rand(2, 4, generator=generator) * 3
    sequence = torch.tensor([0.5, -0.25])  # the reward's share
    log_probs = student.clone().requires_grad_(True)
    streams = Streams(log_probs, torch.zeros(2, 4), student.clone(), sequence, mask, mask.sum().float(),
                      frozen={"teacher": teacher})
    term = reverse_kl_policy_gradient(Norm("token-mean"), clip_low=0.2, clip_high=0.2)
    loss, weight, metrics = micro_batch_loss([term], streams, micro_batches=1, mini=None, filler=False)
    loss.backward()
    advantages = (sequence.unsqueeze(1) - (student - teacher)) * mask
    # At ratio 1 the clipped policy gradient's gradient is -A / tokens on every loss token.
    assert torch.allclose(log_probs.grad, -advantages / mask.sum(), atol=1e-7)
    assert metrics["distill/reverse_kl"] == pytest.approx(float(((student - teacher) * mask).sum() / mask.sum()))
    assert metrics["distill/advantage_abs"] == pytest.approx(float(advantages.abs().sum() / mask.sum()))
    assert float(weight) == 5.0
