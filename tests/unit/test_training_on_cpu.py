"""How the trainer runs TRL on a CPU: the fused LM head projects only the labelled positions and
still gives the loss and gradients of the full projection; no gradient checkpointing; bf16
autocast only where the CPU computes bf16 natively, or where a setting says so."""
from __future__ import annotations

import pytest

from common import processes
from common.records import Route
from common.settings import Settings, load_settings
from tasks import training_settings
from trainer.data import GrpoPrompt, TaskData

pytestmark = pytest.mark.xdist_group("torch")  # tests/unit/conftest.py: torch and TRL are imported in the tests
VOCAB = 64


def tiny_model():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16))


def test_the_fused_head_projects_only_labelled_positions_with_the_full_projections_loss_and_gradients(monkeypatch):
    import torch
    import trl.trainer.utils as trl_utils

    from trainer import trl_internals

    trl_internals.project_labelled_positions_only()  # as every round's training does first (`methods.run`)
    fused, plain = tiny_model(), tiny_model()
    trl_utils.add_fused_lm_head(fused, outputs=("log_probs", "entropy", "is_top1"))
    ids = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1))
    labels = ids.clone()
    labels[:, :17] = -100  # the prompt
    labels[1, 21:] = -100  # padding after a shorter answer
    projected = []
    chunked = trl_utils._ChunkedLogProbFunction

    class Recording:
        @staticmethod
        def apply(hidden, *args):
            projected.append(hidden.shape[0])
            return chunked.apply(hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", Recording)
    output = fused(input_ids=ids, labels=labels, fused_lm_head=True)
    output.loss.backward()
    expected = torch.nn.functional.cross_entropy(plain(input_ids=ids).logits[:, :-1].reshape(-1, VOCAB), labels[:, 1:].reshape(-1))
    expected.backward()

    assert projected == [int((labels[:, 1:] != -100).sum())] == [7 + 4 + 7]
    assert torch.allclose(output.loss, expected, atol=1e-5)
    for (name, p), (_, q) in zip(fused.named_parameters(), plain.named_parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-5), name


def test_the_patch_leaves_other_devices_to_trl_and_is_applied_once():
    import torch
    import trl.trainer.utils as trl_utils

    from trainer import trl_internals

    trl_internals.project_labelled_positions_only()
    uses_triton = trl_utils._use_triton
    assert uses_triton(torch.device("cpu"))
    assert uses_triton(torch.device("meta")) is False  # neither CPU nor a Triton device: TRL's own answer
    trl_internals.project_labelled_positions_only()
    assert trl_utils._use_triton is uses_triton


def test_another_trl_version_is_refused_with_what_to_do(monkeypatch):
    from trainer import trl_internals

    trl_internals.check_version("1.16.3")  # a patch release keeps the private API this module reaches
    for other in ("1.17.0", "2.0.1", "0.16.0"):
        with pytest.raises(trl_internals.TrlVersionError, match=rf"TRL {other} is installed.*TRL 1\.16\.x.*_use_triton"):
            trl_internals.check_version(other)
    monkeypatch.setattr(trl_internals.trl, "__version__", "1.17.0")
    with pytest.raises(trl_internals.TrlVersionError):  # nothing is patched or subclassed on it
        trl_internals.group_dropping_grpo_trainer()


def test_gradient_checkpointing_on_a_cpu_only_where_a_task_asks_for_it():
    """Insights' long answers held 6.5 GB of activations in a round's SFT without it (3.7 with it);
    the other tasks' short ones train faster without it."""
    from trainer import methods

    settings = Settings()
    checkpointed = lambda s: methods.trainer_args(s, epochs=1, batch_size=8, examples=16)["gradient_checkpointing"]
    assert {task: checkpointed(training_settings(settings, task)) for task in ("extraction", "sql", "push", "insights")} == {
        "extraction": False, "sql": False, "push": False, "insights": True}
    assert checkpointed(Settings(train_gradient_checkpointing=True)) is True
    assert checkpointed(training_settings(Settings(train_gradient_checkpointing=True,
                                                   task_training={"sql": {"train_gradient_checkpointing": False}}), "sql")) is False


def test_bf16_where_the_cpu_computes_it_natively_or_a_setting_says_so(monkeypatch):
    from trainer import methods

    assert processes.cpu_computes_bf16("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni\n")
    assert processes.cpu_computes_bf16("flags : fpu amx_bf16 amx_tile\n")
    assert not processes.cpu_computes_bf16("flags : fpu avx2 avx512f avx512bw\n")  # emulated there: slower than fp32
    assert not processes.cpu_computes_bf16("")
    for native, setting, expected in ((True, "auto", True), (False, "auto", False), (True, "fp32", False), (False, "bf16", True)):
        monkeypatch.setattr(processes, "cpu_computes_bf16", lambda native=native: native)
        args = methods.trainer_args(Settings(train_cpu_precision=setting), epochs=1, batch_size=8, examples=16)
        assert args["bf16"] is expected, (native, setting)


def test_a_candidate_trains_with_its_tasks_own_settings(monkeypatch):
    """`task_training` reaches the methods: what a round trains with is the task's own learning
    rate, batch and budget."""
    from trainer import candidate, methods

    seen = []

    class Planned(Exception):
        pass

    def run_plan(settings, *args, **kwargs):
        seen.append(settings)
        raise Planned

    class NoRoutes:
        def route(self, task):
            return Route()

    monkeypatch.setattr(candidate, "load_policy", lambda *args, **kwargs: (None, None))
    monkeypatch.setattr(candidate, "run_plan", run_plan)
    settings = Settings(task_training={"sql": {"train_learning_rate": 0.0005, "sft_batch_size": 2, "train_time_budget_s": 9}})
    for task in ("sql", "push"):
        with pytest.raises(Planned):
            candidate.train_candidate(settings, NoRoutes(), TaskData(task), [("sft", "test")], "r1", None)
    sql, push = seen
    assert methods.trainer_args(sql, 1, sql.sft_batch_size, 10)["learning_rate"] == 0.0005
    assert (sql.sft_batch_size, sql.train_time_budget_s) == (2, 9)
    assert (push.train_learning_rate, push.sft_batch_size, push.train_time_budget_s) == (0.003, 8, 45.0)


def test_bench_finetune_refuses_an_unknown_task_before_anything_runs(tmp_path):
    from typer.testing import CliRunner

    from cli import main as cli

    result = CliRunner().invoke(cli.app, ["bench", "finetune", "--task", "poems"], env={"TUCANO_DATA_DIR": str(tmp_path)})
    assert result.exit_code == 2
    assert "unknown task 'poems'" in result.output and "extraction" in result.output
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("args,option", [
    (["train", "--once", "--task", "poems"], "--task"),
    (["bench", "fix", "--task", "sql", "--task", "poems"], "--task"),
    (["bench", "learn", "--task", "poems"], "--task"),
    (["bench", "learn", "--ablation", "odes"], "--ablation"),
    (["bench", "learn", "--canary", "odes"], "--canary"),
    (["bench", "labels", "--task", "poems"], "--task"),
])
def test_every_command_refuses_an_unknown_task_alike_before_anything_runs(tmp_path, args, option):
    from typer.testing import CliRunner

    from cli import main as cli

    result = CliRunner().invoke(cli.app, args, env={"TUCANO_DATA_DIR": str(tmp_path), "TUCANO_REDIS_URL": "redis://127.0.0.1:1"})
    assert result.exit_code == 2, result.output
    unknown = args[args.index(option) + 1] if args.count(option) == 1 else "poems"
    assert f"{option}: unknown task '{unknown}'; tasks are extraction, sql, push, insights" in " ".join(result.output.split())
    assert list(tmp_path.iterdir()) == []  # nothing built, started or written


def test_grpo_learns_at_its_own_rate_not_the_supervised_one(monkeypatch):
    import trl

    from trainer import grpo

    class Captured(Exception):
        pass

    def capture(**kwargs):
        raise Captured(kwargs)

    monkeypatch.setattr(trl, "GRPOConfig", capture)
    settings = load_settings(train_learning_rate=3e-3, grpo_learning_rate=2e-4)
    with pytest.raises(Captured) as caught:
        grpo.train(settings, None, None, "push", [GrpoPrompt("p", "push", "r0")], 10.0, "test")
    assert caught.value.args[0]["learning_rate"] == 2e-4
    assert caught.value.args[0]["warmup_steps"] == 0  # a handful of steps: the first is not spent at rate 0
    assert load_settings().grpo_learning_rate < load_settings().train_learning_rate


def test_a_bootstrap_of_zero_steps_saves_the_pretrained_weights_as_they_are(tmp_path):
    """TUCANO_BOOTSTRAP_SFT_STEPS=0: the demo model is the pretrained checkpoint, untrained, with the
    template serving renders (it had crashed inside TRL with a StopIteration)."""
    import torch
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    from demo.finetune import finetune

    source, out = tmp_path / "pretrained", tmp_path / "base_model"
    model = tiny_model()
    model.save_pretrained(source)
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")),
                            unk_token="[UNK]").save_pretrained(source)
    steps: list[int] = []
    info = finetune(source, out, {"sql": [{"input": {"question": "q"}, "reference": {"sql": "SELECT 1"}}]},
                    {"base": "{{ messages }}", "think": "{{ thoughts }}"}, set(), 0, 1e-3, 0, False, lambda step, loss: steps.append(step))
    assert (info["sft_steps"], info["sft_examples"], steps) == (0, 0, [])
    saved = AutoModelForCausalLM.from_pretrained(out)
    assert all(torch.equal(mine, theirs) for mine, theirs in zip(model.state_dict().values(), saved.state_dict().values(), strict=True))
    assert AutoTokenizer.from_pretrained(out).chat_template == "{{ messages }}"
