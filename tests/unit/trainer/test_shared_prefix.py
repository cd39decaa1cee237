"""Shared-prefix training (``trainer.workers.prefix_tree``, ``actor.shared_prefix``): rows that
start with the same tokens are packed as a tree, the shared tokens once; log-probs, entropies,
the loss, every parameter's gradient and a whole update equal the unshared packed computation
in float64, on groups with different prompt lengths, multi-turn samples whose observation tokens
are masked, segments with different branch points, identical samples, an empty response, and
micro-batch boundaries inside a tree. Micro-batches keep a group together and count tree tokens.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.unit.trainer.tiny_model import tiny_qwen3
from trainer.algos.correction import CorrectionSpec
from trainer.config.actor import ActorConfig
from trainer.workers.batch import TrainBatch
from trainer.workers.dist import micro_batch_groups
from trainer.workers.inert import skip_inert_rows
from trainer.workers.packing import model_input
from trainer.workers.policy_math import (
    LossSpec,
    _micro_loss,
    forward_log_probs,
    log_probs_in_micro_batches,
    update_policy,
)
from trainer.workers.prefix_tree import PackedTree, build_tree, family_units, tree_tokens

VOCAB = 256


@pytest.fixture(autouse=True)
def norms_in_the_input_dtype(monkeypatch):
    """Qwen3's RMSNorm rounds to float32 and back, which rounds the backward's gradients too:
    the shared prefix's summed gradient and the unshared path's separate ones would round
    differently (~1e-8 relative). Computed in float64 instead, the only gap left is float64's."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        variance = hidden.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(Qwen3RMSNorm, "forward", forward)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def make_batch(samples: list[tuple[list[int], list[int], list[int]]]) -> TrainBatch:
    """Rows of (prompt, response, response mask): prompts left-padded, responses right-padded."""
    p = max(len(s[0]) for s in samples)
    r = max(max(len(s[1]) for s in samples), 1)
    ids = torch.zeros(len(samples), p + r, dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros(len(samples), r, dtype=torch.long)
    for i, (prompt, response, loss_mask) in enumerate(samples):
        ids[i, p - len(prompt) : p] = torch.tensor(prompt)
        attn[i, p - len(prompt) : p] = 1
        if response:
            ids[i, p : p + len(response)] = torch.tensor(response)
            attn[i, p : p + len(response)] = 1
            mask[i, : len(response)] = torch.tensor(loss_mask)
    g = torch.Generator().manual_seed(len(samples))
    return TrainBatch(
        input_ids=ids,
        attention_mask=attn,
        position_ids=(attn.cumsum(1) - 1).clamp(min=0),
        response_mask=mask,
        advantages=torch.randn(len(samples), r, generator=g, dtype=torch.float64) * mask,
        old_log_probs=-torch.rand(len(samples), r, generator=g, dtype=torch.float64) * mask,
    )


def sampled(response: list[int]) -> list[int]:
    return [1] * len(response)


def mixed_batch() -> TrainBatch:
    """Two groups with prompts of different lengths (one sample of the first has an empty
    response, two of the second are identical, one is multi-turn with a masked observation),
    a session's three segments that branch at different points, and an unrelated row."""
    a, b = tokens(40, 1), tokens(23, 2)
    rows: list[tuple[list[int], list[int], list[int]]] = []
    for k in range(3):
        resp = tokens(5 + 3 * k, 10 + k)
        rows.append((a, resp, sampled(resp)))
    rows.append((a, [], []))  # empty response
    same = tokens(7, 20)
    rows += [(b, same, sampled(same)), (b, same, sampled(same))]
    turn1, obs, turn2 = tokens(6, 21), tokens(9, 22), tokens(4, 23)
    rows.append((b, turn1 + obs + turn2, [1] * 6 + [0] * 9 + [1] * 4))
    history = tokens(30, 30)  # a session: segments whose prompts extend its history
    for cut, seed in ((18, 31), (30, 32), (24, 33)):
        resp = tokens(6, seed)
        rows.append((history[:cut] + tokens(3, seed + 10), resp, sampled(resp)))
    lone = tokens(12, 40)
    rows.append((tokens(9, 41), lone, sampled(lone)))
    return make_batch(rows)


def float64_model() -> torch.nn.Module:
    return tiny_qwen3().double().eval()


def rows_of(mb: TrainBatch) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    real = mb.attention_mask.bool()
    lengths = real.sum(-1).tolist()
    return list(mb.input_ids[real].split(lengths)), list(mb.position_ids[real].split(lengths))


def test_a_group_packs_its_prompt_once_and_each_continuation_after_it():
    prompt = tokens(20, 1)
    responses = [tokens(4, 2), tokens(6, 3), tokens(5, 4)]
    mb = make_batch([(prompt, r, sampled(r)) for r in responses])
    flat, shared = model_input(mb, packed=True), model_input(mb, packed=True, shared_prefix=True)
    assert flat.input_ids.shape[1] == 3 * 20 + 15
    assert shared.input_ids.shape[1] == 20 + 15
    tree = shared.tree
    assert tree is not None and tree.parents == (-1, 0, 0, 0)
    assert tree.spans[0] == (0, 20)
    # continuations' positions go on from the prompt's
    positions = shared.position_ids[0].tolist()
    for s, e in tree.spans[1:]:
        assert positions[s:e] == list(range(20, 20 + e - s))
    # every row's first response token is predicted by the one shared prompt position
    t = shared.targets
    first = t.cols == 0
    assert t.positions[first].tolist() == [19, 19, 19]
    # a continuation attends to the whole prompt and causally to itself
    for node in (1, 2, 3):
        n = tree.spans[node][1] - tree.spans[node][0]
        mask = tree.mask(node, torch.device("cpu"))
        assert mask.shape == (n, 20 + n) and bool(mask[:, :20].all())
        assert torch.equal(mask[:, 20:], torch.ones(n, n, dtype=torch.bool).tril())


def test_trees_follow_branch_points_and_leave_short_or_no_overlaps_flat():
    base = tokens(50, 5)
    seqs = [
        torch.tensor(base[:30] + tokens(5, 6)),  # branches from the others at 30
        torch.tensor(base + tokens(3, 7)),  # these two share 50
        torch.tensor(base + tokens(4, 8)),
        torch.tensor(base[:10] + tokens(8, 9)),  # shares only 10 < 16: its own root
        torch.tensor(tokens(12, 10)),
    ]
    positions = [torch.arange(len(s)) for s in seqs]
    tree = build_tree(seqs, positions, min_shared=16)
    spans, parents = tree.tree.spans, tree.tree.parents
    lengths = [e - s for s, e in spans]
    # nodes: root [0,30), its leaf (5), node [30,50), two leaves, then two flat roots
    root = next(k for k, p in enumerate(parents) if p == -1 and lengths[k] == 30)
    assert tree.input_ids[spans[root][0] : spans[root][1]].tolist() == base[:30]
    inner = lengths.index(20)
    assert parents[inner] == root
    assert sorted(n for k, n in enumerate(lengths) if parents[k] == inner) == [3, 4]
    assert sorted(n for k, n in enumerate(lengths) if parents[k] == root) == [5, 20]
    assert sorted(n for k, n in enumerate(lengths) if parents[k] == -1) == [12, 18, 30]
    assert tree.input_ids.numel() == 30 + 5 + 20 + 3 + 4 + 18 + 12
    # with 10 shared tokens below the 30 (under min_shared=16), the 50-token rows split at 30
    short = build_tree([seqs[0], seqs[1][:43], seqs[2][:44]], positions[:3], min_shared=16)
    assert sorted(e - s for s, e in short.tree.spans) == [5, 13, 14, 30]
    assert tree_tokens(seqs, positions, 16) == tree.input_ids.numel()
    # each row's tokens read back from the packed row through its index
    for r, seq in enumerate(seqs):
        assert torch.equal(tree.input_ids[tree.index[r, : len(seq)]], seq)
    # the same tokens at other positions are not shared
    shifted = [positions[0], positions[1] + 1, positions[2], positions[3], positions[4]]
    assert build_tree(seqs, shifted).input_ids.numel() > tree.input_ids.numel()
    # no sharing: every row a root, as the unshared layout
    assert PackedTree.flat([3, 4]).spans == ((0, 3), (3, 7)) and not PackedTree.flat([3]).shares


@pytest.mark.parametrize("chunk", [0, 4])
def test_log_probs_and_entropies_equal_the_unshared_computation(chunk):
    model, mb = float64_model(), mixed_batch()
    assert model_input(mb, packed=True, shared_prefix=True).tree.shares
    with torch.no_grad():
        ref, ref_ent = forward_log_probs(model, mb, with_entropy=True, chunk_size=chunk)
        got, ent = forward_log_probs(
            model, mb, with_entropy=True, chunk_size=chunk, shared_prefix=True
        )
    assert torch.equal(ref != 0, mb.response_mask.bool())
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)


def loss_and_grads(
    shared: bool, mb: TrainBatch, entropy_coeff: float = 0.01
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model = float64_model()
    spec = replace(
        LossSpec.from_config(ActorConfig(entropy_coeff=entropy_coeff), 1.0), shared_prefix=shared
    )
    loss, _ = _micro_loss(model, mb, spec, denominator=float(mb.response_mask.sum()), scale=1.0)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_the_loss_and_every_parameter_gradient_equal_the_unshared_computation():
    mb = mixed_batch()
    ref_loss, ref_grads = loss_and_grads(False, mb)
    loss, grads = loss_and_grads(True, mb)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-12)
    assert ref_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-9, atol=1e-12, msg=name)
    assert any(float(g.abs().max()) > 0 for g in grads.values())


def test_a_sample_of_a_tree_gets_the_gradient_of_its_own_tokens_only():
    """The loss on one continuation alone (the others' advantages 0) moves the shared prompt
    only through that continuation: the same gradient as that sample packed by itself."""
    prompt = tokens(20, 1)
    responses = [tokens(5, 2), tokens(7, 3), tokens(6, 4)]
    mb = make_batch([(prompt, r, sampled(r)) for r in responses])
    mb.advantages[[0, 2]] = 0
    _, grads = loss_and_grads(True, mb, entropy_coeff=0.0)
    alone = mb.select(torch.tensor([1])).trimmed()
    _, ref = loss_and_grads(False, alone, entropy_coeff=0.0)
    scale = float(alone.response_mask.sum()) / float(mb.response_mask.sum())
    for name, grad in grads.items():  # the loss is a token mean over the micro-batch
        torch.testing.assert_close(grad, ref[name] * scale, rtol=1e-9, atol=1e-12, msg=name)


def test_micro_batches_keep_a_group_together_and_count_tree_tokens():
    mb = mixed_batch()
    seqs, positions = rows_of(mb)
    # two groups of 4 in interleaved rows: fixed micro-batches of 4 hold one group each
    a, b = tokens(30, 1), tokens(30, 2)
    rows = [(prompt, r, sampled(r)) for k in range(4) for prompt in (a, b) for r in [tokens(3, k)]]
    groups = micro_batch_groups(make_batch(rows), 4, dynamic=False, max_tokens=0, shared=True)
    assert sorted(g.tolist() for g in groups) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    groups = micro_batch_groups(mb, 4, dynamic=False, max_tokens=0, shared=True)
    assert sorted(r for g in groups for r in g.tolist()) == list(range(len(mb)))
    budget = 90
    groups = micro_batch_groups(mb, 1, dynamic=True, max_tokens=budget, shared=True)
    for g in groups:
        rows = g.tolist()
        assert tree_tokens([seqs[r] for r in rows], [positions[r] for r in rows], 16) <= budget
    # the first group (40-token prompt, 4 rows) holds 40 + 5 + 8 + 11 = 64 tree tokens: whole
    assert any({0, 1, 2, 3} <= set(g.tolist()) for g in groups)
    # flat, the same rows hold 40 * 4 + 24 = 184 tokens: at least 3 micro-batches
    flat = micro_batch_groups(mb, 1, dynamic=True, max_tokens=budget, packed=True)
    assert len(groups) < len(flat)


def test_a_family_over_the_budget_is_split_in_tree_order_and_units_reach_a_count():
    prompt = tokens(40, 1)
    seqs = [torch.tensor(prompt + tokens(10, k)) for k in range(6)]
    positions = [torch.arange(50)] * 6
    units, costs = family_units(seqs, positions, max_tokens=70)
    assert [len(u) for u in units] == [3, 3] and costs == [70, 70]
    units, costs = family_units(seqs, positions, max_tokens=1000, min_units=3)
    assert len(units) == 3 and sorted(r for u in units for r in u) == list(range(6))


def test_log_probs_are_exact_when_micro_batch_boundaries_fall_inside_a_tree():
    model, mb = float64_model(), mixed_batch()
    with torch.no_grad():
        ref, _ = log_probs_in_micro_batches(model, mb, micro_batch_size=len(mb))
        # 3 rows a micro-batch: the first group (4 rows) is cut in two
        got, _ = log_probs_in_micro_batches(model, mb, micro_batch_size=3, shared_prefix=True)
        tight, _ = log_probs_in_micro_batches(
            model, mb, micro_batch_size=1, use_dynamic_bsz=True, max_token_len=60,
            shared_prefix=True,
        )  # fmt: skip
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(tight, ref, rtol=0, atol=1e-12)


def test_an_update_with_shared_prefixes_equals_the_unshared_update():
    mb = mixed_batch()
    after = []
    for shared in (False, True):
        model = float64_model().train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        cfg = ActorConfig(
            ppo_micro_batch_size_per_gpu=3, ppo_mini_batch_size=len(mb), shared_prefix=shared
        )
        metrics = update_policy(model, optimizer, None, mb, cfg, samples_per_mini_batch=len(mb))
        after.append(({n: p.detach().clone() for n, p in model.named_parameters()}, metrics))
    (ref, ref_metrics), (got, metrics) = after
    for name, value in got.items():
        torch.testing.assert_close(value, ref[name], rtol=0, atol=1e-12, msg=name)
    assert metrics["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"], rel=1e-9)
    # the update says what the trees saved: 1 - tree tokens / row tokens over its micro-batches
    seqs, positions = rows_of(mb)
    groups = micro_batch_groups(mb, 3, dynamic=False, max_tokens=0, packed=True, shared=True)
    tree = sum(tree_tokens([seqs[i] for i in g], [positions[i] for i in g], 16) for g in groups)
    saved = 1 - tree / sum(len(s) for s in seqs)
    assert metrics["actor/shared_prefix_saved_frac"] == pytest.approx(saved) and saved > 0.2
    assert "actor/shared_prefix_saved_frac" not in ref_metrics


def test_skipping_zero_advantage_rows_inside_trees_changes_no_update():
    """Two continuations of the first group and a session segment with advantage 0 on every
    token become fillers (``actor.skip_zero_advantage_rows``): their trees lose them and the
    update with shared prefixes is the whole batch's."""
    mb = mixed_batch()
    mb.advantages[[1, 2, 8]] = 0
    cfg = ActorConfig(
        ppo_micro_batch_size_per_gpu=3, ppo_mini_batch_size=len(mb), shared_prefix=True
    )
    computed, skipped = skip_inert_rows(mb, cfg, CorrectionSpec())
    assert skipped.nonzero().flatten().tolist() == [1, 2, 8]
    after = []
    for b in (mb, computed):
        model = float64_model().train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        update_policy(model, optimizer, None, b, cfg, samples_per_mini_batch=len(mb))
        after.append({n: p.detach().clone() for n, p in model.named_parameters()})
    ref, got = after
    for name, value in got.items():
        torch.testing.assert_close(value, ref[name], rtol=0, atol=1e-12, msg=name)
    start = dict(float64_model().named_parameters())
    assert any(not torch.equal(value, start[name]) for name, value in ref.items())  # it moved


def test_critic_values_and_their_gradients_equal_the_unshared_computation():
    import transformers

    from trainer.workers.critic_math import forward_values, values_in_micro_batches

    mb = mixed_batch()
    out = []
    for shared in (False, True):
        torch.manual_seed(0)
        config = transformers.Qwen3Config(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_labels=1,
            classifier_dropout=0.0,  # as the trainer builds a critic
        )  # fmt: skip
        critic = transformers.Qwen3ForTokenClassification(config).double()
        values = forward_values(critic, mb, shared_prefix=shared)
        (values * mb.advantages).sum().backward()
        with torch.no_grad():
            passed = values_in_micro_batches(critic, mb, micro_batch_size=3, shared_prefix=shared)
        out.append((values.detach(), passed, {n: p.grad for n, p in critic.named_parameters()}))
    (ref, ref_passed, ref_grads), (got, passed, grads) = out
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(passed, ref_passed, rtol=0, atol=1e-6)  # float32 results
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-9, atol=1e-12, msg=name)


def test_the_critic_follows_the_actors_shared_prefix_unless_set():
    from trainer.config.actor import ModelConfig
    from trainer.config.critic import CriticConfig, CriticModelConfig

    model = ModelConfig(path="tiny-qwen3")
    assert CriticConfig().spec(ActorConfig(shared_prefix=True), model).shared_prefix
    assert not CriticConfig().spec(ActorConfig(shared_prefix=False), model).shared_prefix
    # the critic's own padded rows: null means off there, true is refused naming the key
    padded = CriticConfig(model=CriticModelConfig(use_remove_padding=False))
    assert not padded.spec(ActorConfig(shared_prefix=True), model).shared_prefix
    padded.shared_prefix = True
    with pytest.raises(ValueError) as info:
        padded.spec(ActorConfig(shared_prefix=True), model)
    assert str(info.value) == (
        "critic.shared_prefix=true needs packed rows on sdpa or eager attention, but "
        "critic.model.use_remove_padding=false: set critic.shared_prefix=false (or null)"
    )
    assert (
        not CriticConfig(shared_prefix=False)
        .spec(ActorConfig(shared_prefix=True), model)
        .shared_prefix
    )


def test_a_model_on_another_attention_kernel_is_refused_naming_the_keys():
    model = float64_model()
    model.config._attn_implementation = "flash_attention_2"  # not switchable to packed trees
    mb = mixed_batch()
    with pytest.raises(ValueError) as info:
        forward_log_probs(model, mb, shared_prefix=True)
    assert str(info.value) == (
        "shared_prefix (actor_rollout_ref.actor / critic) needs the project's packed attention, "
        "but the model runs 'flash_attention_2': set actor_rollout_ref.model.attn_implementation="
        "sdpa, or shared_prefix=false"
    )


def test_balancing_over_ranks_keeps_each_group_on_one_rank():
    from trainer.workers.balance import rank_layout

    prompts = [tokens(n, 50 + n) for n in (60, 40, 30, 20)]
    rows = [
        (prompts[g], r, sampled(r))
        for k in range(4)
        for g in range(4)
        for r in [tokens(3 + k + g, 100 + 4 * k + g)]
    ]  # interleaved: row i is group i % 4
    batch = make_batch(rows)
    layout = rank_layout(batch, world=2, mini_batches=1, balance=True, shared=True)
    position = {int(r): int(p) for r, p in zip(range(len(batch)), layout.order, strict=True)}
    rank_of = [position[i] // layout.per_mini for i in range(len(batch))]
    for g in range(4):
        assert len({rank_of[i] for i in range(g, 16, 4)}) == 1, g
    # the two ranks' tree tokens: the 60- and 20-token groups on one, 40 and 30 on the other
    seqs, positions = rows_of(batch)
    load = [
        tree_tokens(
            [seqs[i] for i in range(16) if rank_of[i] == k],
            [positions[i] for i in range(16) if rank_of[i] == k],
            16,
        )
        for k in range(2)
    ]
    assert abs(load[0] - load[1]) <= 16
    # plain balancing (per row) spreads every group over both ranks
    plain = rank_layout(batch, world=2, mini_batches=1, balance=True)
    plain_rank = [int(plain.order[i]) // plain.per_mini for i in range(16)]
    assert any(len({plain_rank[i] for i in range(g, 16, 4)}) == 2 for g in range(4))


def test_a_lora_adapter_gets_the_unshared_gradients():
    from trainer.config.actor import ModelConfig
    from trainer.workers.lora import apply_lora

    mb = mixed_batch()
    out = []
    for shared in (False, True):
        model = apply_lora(float64_model(), ModelConfig(path="tiny", lora_rank=4, lora_alpha=8))
        model.double()  # the adapter is made float32; float64 leaves only float64's gap
        for name, param in model.named_parameters():
            if "lora_B" in name:  # B starts at 0: give the adapter an effect to differentiate
                torch.nn.init.normal_(param, std=0.05, generator=torch.Generator().manual_seed(1))
        log_probs, _ = forward_log_probs(model, mb, shared_prefix=shared)
        (log_probs * mb.advantages).sum().backward()
        out.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert out[0].keys() == out[1].keys() and all("lora_" in n for n in out[0])
    for name, grad in out[1].items():
        torch.testing.assert_close(grad, out[0][name], rtol=1e-9, atol=1e-12, msg=name)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], True),
        (["actor_rollout_ref.model.use_remove_padding=false"], False),
        (["actor_rollout_ref.model.attn_implementation=flash_attention_2"], False),
        (["actor_rollout_ref.actor.shared_prefix=false"], False),
    ],
)
def test_null_turns_it_on_wherever_packed_trees_run(overrides, expected):
    from trainer.config import load_config

    config, _ = load_config(["actor_rollout_ref.model.path=tiny-qwen3", *overrides])
    assert config.actor_rollout_ref.actor.shared_prefix is expected


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("actor_rollout_ref.model.use_remove_padding=false", "use_remove_padding=false"),
        (
            "actor_rollout_ref.model.attn_implementation=flash_attention_2",
            "attn_implementation=flash_attention_2",
        ),
    ],
)
def test_true_where_trees_cannot_run_is_refused_naming_the_keys(override, why):
    from trainer.config import ConfigError, load_config

    args = ["actor_rollout_ref.model.path=tiny-qwen3", "actor_rollout_ref.actor.shared_prefix=true"]
    with pytest.raises((ValueError, ConfigError)) as info:
        load_config([*args, override])
    assert (
        "actor_rollout_ref.actor.shared_prefix=true needs packed rows on sdpa or eager "
        f"attention, but actor_rollout_ref.model.{why}: set "
        "actor_rollout_ref.actor.shared_prefix=false (or null)"
    ) in str(info.value)


def test_the_cuda_form_of_a_continuations_mask_gives_the_same_gradients(monkeypatch):
    """On CUDA a continuation runs on repeated key/value heads with a ``causal_lower_right``
    bias (no bool mask, which would send grouped-query heads to the math kernel); forced here
    on CPU, it equals the unshared computation as the bool mask does."""
    from trainer.workers import varlen_attention

    mb = mixed_batch()
    ref_loss, ref_grads = loss_and_grads(False, mb)
    monkeypatch.setattr(varlen_attention, "_LOWER_RIGHT_DEVICES", ("cuda", "cpu"))
    loss, grads = loss_and_grads(True, mb)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-12)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-9, atol=1e-12, msg=name)
