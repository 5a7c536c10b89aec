"""Task prompts rendered through a pretrained parent's tokenizer (par_ray.prompts), on the real Qwen BPE: every task's
table is single tokens, distinct, and clear of the halting and chain-of-thought tokens; random-init backbones keep
the compact ids."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

from par_ray.cot import COT_WORDS, trial_cot_tokens
from par_ray.halting import HALT_WORDS, halt_tokens, tokenizer_halt_tokens
from par_ray.prompts import render, token_table
from par_ray.tasks import TASKS, build_task
from par_ray.tasks.common import Rendered
from par_ray.config import TaskConfig

from conftest import QWEN_TOKENIZER_DIR  # noqa: E402 - tests/ is on sys.path (pytest rootdir conftest)


@pytest.fixture(scope="module")
def qwen():
    """The Qwen2/Qwen3 tokenizer, loaded as a checkpoint's tokenizer is (AutoTokenizer.from_pretrained(dir))."""
    return AutoTokenizer.from_pretrained(QWEN_TOKENIZER_DIR)


@pytest.mark.parametrize("name", list(TASKS))
def test_every_task_renders_to_single_distinct_tokens_clear_of_halting_and_cot(name, qwen):
    task = TASKS[name]
    assert len(task.words) == task.vocab_size
    table = token_table(task, qwen)
    assert len(table) == len(set(table)) == task.vocab_size
    assert all(len(qwen.encode(w, add_special_tokens=False)) == 1 for w in task.words)
    reserved = {qwen.encode(w, add_special_tokens=False)[0] for w in (*HALT_WORDS, *COT_WORDS)}
    assert not reserved & set(table)
    assert [qwen.decode([t]) for t in table] == list(task.words)  # each token reads back as its word


def test_halting_and_cot_words_are_single_distinct_qwen_tokens(qwen):
    halt = tokenizer_halt_tokens(qwen)
    cot = trial_cot_tokens(TASKS["swap_s5"], qwen)
    assert len({halt.query, halt.yes, halt.no, cot.step, cot.end}) == 5
    assert halt_tokens(TASKS["swap_s5"], qwen) == halt


def test_a_rendered_prompt_reads_as_words_and_keeps_the_batch(qwen):
    base = TASKS["swap_s5"]
    task = render(base, qwen)
    assert isinstance(task, Rendered) and task.name == base.name and task.num_queries == base.num_queries
    ep, raw = task.sample(3, 4, seed=0), base.sample(3, 4, seed=0)
    assert torch.equal(ep.input_ids, task.token_ids[raw.input_ids]) and torch.equal(ep.states, task.token_ids[raw.states])
    assert torch.equal(ep.read_positions, raw.read_positions) and torch.equal(ep.progress_ids, raw.progress_ids)
    text = qwen.decode(ep.input_ids[0])
    assert text.startswith("<|endoftext|>") and text.endswith(": A B C D E"), text
    assert set(ep.states.flatten().tolist()) <= set(task.answer_token_ids)
    assert {qwen.decode([t]) for t in task.answer_token_ids} == {" apple", " ball", " cup", " dog", " egg"}
    # wrappers compose: separators padded by Filler are the rendered SEP
    filler = render(build_task(TaskConfig(name="swap_s5", train_filler=3), train=True), qwen)
    assert qwen.decode(filler.sample(2, 2, seed=0, step=1).input_ids[0]).count(":") >= 1


def test_random_init_backbones_keep_the_compact_ids():
    task = TASKS["s5"]
    assert render(task, None) is task
    assert torch.equal(render(task, None).sample(4, 2, seed=1).input_ids, task.sample(4, 2, seed=1).input_ids)


class _Tokenizer:
    """A tokenizer stand-in: word -> ids."""

    def __init__(self, vocab):
        self.vocab = vocab

    def encode(self, text, add_special_tokens=True):
        return self.vocab.get(text, [hash(text) % 10_000 + 100])


def test_a_table_that_splits_repeats_or_collides_is_refused_naming_each_problem():
    task = TASKS["parity"]  # words: <|endoftext|>, ":", " parity", "0", "1"
    tok = _Tokenizer({"<|endoftext|>": [1], ":": [2], " parity": [3, 4], "0": [5], "1": [5], "?": [2],
                      " Yes": [7], " No": [8], ",": [9], ".": [10]})
    with pytest.raises(ValueError, match=r"'parity'.*' parity' is 2 tokens \[3, 4\].*'0' and '1' are the same token 5"
                                         r".*':' is token 2, the halting word '\?'"):
        token_table(task, tok)
    with pytest.raises(ValueError, match="words for"):
        token_table(type("T", (), {"name": "x", "words": (), "vocab_size": 3})(), tok)


def test_a_loaded_model_is_probed_with_the_prompts_it_was_trained_on(qwen, write_checkpoint, tmp_path):
    """``load_trained``'s consumers (``evaluate_trained``, scripts/probe_depths.py) sample through ``trained_task``:
    the stored config's parent tokenizer renders the task's words, as the training loop did; random-init: compact."""
    from par_ray.config import BackboneConfig, TrialConfig
    from par_ray.train.checkpoint import trained_task

    directory = write_checkpoint(tmp_path / "parent", "qwen2.5-0.5b")
    pretrained = TrialConfig(backbone=BackboneConfig(name="qwen2.5-0.5b", pretrained=directory),
                             task=TaskConfig(name="swap_s5", train_depth=4))
    task, want = trained_task(pretrained), render(TASKS["swap_s5"], qwen)
    assert isinstance(task, Rendered) and task.token_ids.tolist() == want.token_ids.tolist()
    assert torch.equal(task.sample(4, 2, seed=3).input_ids, want.sample(4, 2, seed=3).input_ids)
    random_init = TrialConfig(task=TaskConfig(name="swap_s5", train_depth=4))
    assert torch.equal(trained_task(random_init).sample(4, 2, seed=3).input_ids,
                       TASKS["swap_s5"].sample(4, 2, seed=3).input_ids)
