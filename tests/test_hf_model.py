"""The HF model: position embedding, interleaving, loss, KV-cache generation and its frame boundaries.

Tolerance: logits are compared at atol 1e-4 in float32 (the tiny model's logits are ~0.2 in size;
cached and uncached paths differ by ~1e-6 from summation order).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, DynamicCache

import terra_nb  # noqa: F401
from terra_nb.port.layout import FrameLayout
from terra_nb.port.hf_model import (
    IGNORE_INDEX,
    LlamaActionForCausalLM,
    LlamaActionV2ForCausalLM,
    interleave_labels,
    register,
)
from terra_nb.port.interleave import action_slot_mask
from terra_nb.port.rollout import SamplingConfig, hf_generate_kwargs, hf_rollout

pytestmark = pytest.mark.usefixtures("single_thread")

ATOL = 1e-4
P, A, FL = 64, 6, 70  # tiny preset: codes per frame, action slots, frame length


@pytest.fixture(scope="module")
def m1(tiny_ckpt):
    return AutoModelForCausalLM.from_pretrained(tiny_ckpt).eval()


@pytest.fixture(scope="module")
def m2(tiny_ckpt_v2):
    return AutoModelForCausalLM.from_pretrained(tiny_ckpt_v2).eval()


@pytest.fixture(params=["v1", "v2"])
def model(request, m1, m2):
    return m1 if request.param == "v1" else m2


def codes(n, batch=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 512, (batch, n), generator=g)


def acts(n_frames, batch=1, seed=0):
    g = torch.Generator().manual_seed(100 + seed)
    return torch.randn(batch, n_frames, A, 3, generator=g) * 3


def reference_logits(model, ids: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """vLLM-style reference, no cache: placeholders in the action slots, replaced by projected actions.

    `ids` are image codes [B, n]; every complete frame gets its 6 slots, a partial tail none.
    """
    layout = model.layout
    B, n = ids.shape
    rows, ph = [], layout.placeholder_id
    for b in range(B):
        seq = []
        for f in range(0, n, P):
            chunk = ids[b, f : f + P].tolist()
            seq += chunk + ([ph] * A if len(chunk) == P else [])
        rows.append(seq)
    full = torch.tensor(rows)
    L = full.shape[1]
    slot = action_slot_mask(L, layout)
    emb = model.model.embed_tokens(full)
    n_act_frames = int(slot.sum()) // A
    emb[:, slot] = model.action_projection(actions[:, :n_act_frames]).reshape(B, -1, emb.shape[-1])
    emb = emb + model.pos_embedding_spatio_temporal(torch.arange(L))
    hidden = model.model(inputs_embeds=emb).last_hidden_state
    return model.lm_head(hidden)


# ----------------------------------------------------------------------------- classes and weights
def test_auto_class_and_weight_names(m1, m2, tiny_ckpt):
    assert type(m1) is LlamaActionForCausalLM and type(m2) is LlamaActionV2ForCausalLM
    assert isinstance(m1.action_projection, torch.nn.Linear)
    names2 = {k for k in m2.state_dict() if k.startswith("action_projection")}
    assert names2 == {f"action_projection.{i}.{w}" for i in (0, 2, 4) for w in ("weight", "bias")}
    # the checkpoint on disk and the class hold the same tensors (none left at its random init), loaded as written
    from safetensors.torch import load_file

    on_disk, state = load_file(str(tiny_ckpt / "model.safetensors")), m1.state_dict()
    assert set(on_disk) == set(state), set(on_disk) ^ set(state)
    assert all(torch.equal(state[k], v) for k, v in on_disk.items())
    assert m1.pos_embedding_spatio_temporal.spatio_embeddings.weight.shape == (70, 128)
    assert m1.pos_embedding_spatio_temporal.temporal_embeddings.weight.shape == (25, 128)


def test_register_is_idempotent():
    from transformers import AutoModel

    register()
    register()
    from terra_nb.workbook.checkpoints import preset_config

    cfg = preset_config("tiny", "v2")
    assert type(AutoModel.from_config(cfg)) is LlamaActionV2ForCausalLM


# ----------------------------------------------------------------------------- position embedding
def test_position_embedding_is_factorized(m1):
    pe = m1.pos_embedding_spatio_temporal
    pos = torch.tensor([0, 5, 63, 64, 69, 70, 71, 139, 140, 1749])
    want = pe.spatio_embeddings.weight[pos % 70] + pe.temporal_embeddings.weight[pos // 70]
    torch.testing.assert_close(pe(pos), want, rtol=0, atol=0)
    assert pe(pos.view(2, 5)).shape == (2, 5, 128)


# ----------------------------------------------------------------------------- interleaving
def test_interleaved_embeddings(model):
    ids, a = codes(2 * P + 5, batch=2), acts(3, batch=2)
    x = model.embed_interleaved(ids, a, past_len=0)
    assert x.shape == (2, 2 * FL + 5, 128)
    pe = model.pos_embedding_spatio_temporal(torch.arange(2 * FL + 5))
    tok = model.model.embed_tokens(ids)
    # image positions: token embedding + PE
    torch.testing.assert_close(x[:, :P], tok[:, :P] + pe[:P])
    torch.testing.assert_close(x[:, FL : FL + P], tok[:, P : 2 * P] + pe[FL : FL + P])
    torch.testing.assert_close(x[:, 2 * FL :], tok[:, 2 * P :] + pe[2 * FL :])
    # action positions: projected actions of that frame + PE; the partial frame 2 gets none
    torch.testing.assert_close(x[:, P:FL], model.action_projection(a[:, 0]) + pe[P:FL])
    torch.testing.assert_close(x[:, FL + P : 2 * FL], model.action_projection(a[:, 1]) + pe[FL + P : 2 * FL])


def test_decode_step_at_frame_end_appends_actions(m1):
    ids, a = codes(1, batch=2), acts(3, batch=2)
    past = 2 * FL + P - 1  # the fed code is the last code of frame 2
    x = m1.embed_interleaved(ids, a, past_len=past)
    assert x.shape == (2, 7, 128)
    pe = m1.pos_embedding_spatio_temporal(torch.arange(past, past + 7))
    torch.testing.assert_close(x[:, 1:], m1.action_projection(a[:, 2]) + pe[1:])
    x_mid = m1.embed_interleaved(ids, a, past_len=past - 1)
    assert x_mid.shape == (2, 1, 128)


def test_actions_accept_flat_and_frame_forms(m1):
    ids, a = codes(2 * P), acts(2)
    with torch.no_grad():
        l4 = m1(input_ids=ids, actions=a).logits
        l3 = m1(input_ids=ids, actions=a.reshape(1, 2 * A, 3)).logits
    torch.testing.assert_close(l3, l4, rtol=0, atol=0)


def test_forward_matches_placeholder_reference(model):
    ids, a = codes(3 * P + 7, batch=2, seed=1), acts(3, batch=2, seed=1)
    with torch.no_grad():
        got = model(input_ids=ids, actions=a).logits
        want = reference_logits(model, ids, a)
    assert got.shape == (2, 3 * FL + 7, 513)
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)


def test_actions_change_the_output(m1):
    ids, a = codes(2 * P), acts(2)
    with torch.no_grad():
        l0 = m1(input_ids=ids, actions=a).logits
        l1 = m1(input_ids=ids, actions=a + 1.0).logits
    assert torch.equal(l0[:, :P], l1[:, :P])  # causal: positions before the first actions are unchanged
    assert (l0[:, P:] - l1[:, P:]).abs().max() > 1e-3


def test_forward_errors(m1):
    ids, a = codes(P), acts(1)
    with pytest.raises(ValueError, match="position_ids"):
        m1(input_ids=ids, actions=a, position_ids=torch.arange(P)[None])
    with pytest.raises(ValueError, match="padding"):
        m1(input_ids=ids, actions=a, attention_mask=torch.zeros(1, P, dtype=torch.long))
    with pytest.raises(ValueError, match="inputs_embeds"):
        m1(inputs_embeds=torch.zeros(1, 3, 128))
    with pytest.raises(ValueError, match=r"actions cover 0 frames but \d+ are needed"):
        m1(input_ids=ids)
    with pytest.raises(ValueError, match="actions cover 1 frames but 2 are needed"):
        m1(input_ids=codes(2 * P), actions=a)
    with pytest.raises(ValueError, match="sequence too long"):
        m1(input_ids=codes(25 * P + 1), actions=acts(25))
    with pytest.raises(ValueError, match="actions hold 3 rollouts"):
        m1(input_ids=codes(P, batch=2), actions=acts(1, batch=3))
    with pytest.raises(ValueError, match="wrong action shape"):
        m1(input_ids=ids, actions=torch.zeros(1, 5, 3))
    out = m1(input_ids=ids, actions=a, return_dict=False)
    assert isinstance(out, tuple) and out[0].shape == (1, FL, 513)


# ----------------------------------------------------------------------------- labels and loss
def test_interleave_labels_layout():
    layout = FrameLayout(image_tokens=4, action_tokens=2, max_frames=5, vocab_size=11)
    labels = torch.arange(10).view(1, 10)  # 2 whole frames of 4 codes + 2 codes
    got = interleave_labels(labels, 0, layout)[0].tolist()
    x = IGNORE_INDEX
    assert got == [0, 1, 2, 3, x, x, 4, 5, 6, 7, x, x, 8, 9]
    # continuing after a cache that ends at the third code of frame 1: one code, then frame 1's slots
    assert interleave_labels(torch.tensor([[7, 8]]), 6 + 3, layout)[0].tolist() == [7, x, x, 8]


def test_loss_is_shifted_cross_entropy_over_codes(model):
    ids, a = codes(2 * P + 10, batch=2, seed=3), acts(3, batch=2, seed=3)
    labels = ids.clone()
    labels[0, 5] = IGNORE_INDEX
    with torch.no_grad():
        out = model(input_ids=ids, actions=a, labels=labels)
        logits = model(input_ids=ids, actions=a).logits
    # by hand: interleaved position of code i, and the logits one position earlier predict it
    pos = [f * FL + s for f in range(3) for s in range(P)][: ids.shape[1]]
    terms = []
    for b in range(2):
        for i in range(1, ids.shape[1]):
            if labels[b, i] == IGNORE_INDEX:
                continue
            terms.append(F.cross_entropy(logits[b, pos[i] - 1][None], labels[b, i][None]))
    want = torch.stack(terms).mean()
    torch.testing.assert_close(out.loss, want, rtol=1e-5, atol=1e-6)
    # 2 * (2*64 + 10 - 1) targets minus the one ignored code
    assert len(terms) == 2 * (2 * P + 9) - 1
    assert out.logits.shape == logits.shape


def test_loss_first_code_of_a_frame_is_scored_from_the_last_action(m1):
    ids, a = codes(P + 1), acts(2)
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, P] = ids[0, P]  # only the first code of frame 1
    with torch.no_grad():
        loss = m1(input_ids=ids, actions=a, labels=labels).loss
        logits = m1(input_ids=ids, actions=a).logits
    torch.testing.assert_close(loss, F.cross_entropy(logits[0, FL - 1][None], ids[0, P][None]))


# ----------------------------------------------------------------------------- KV cache
def test_chunked_cached_forward_equals_full_forward(model):
    """Feeding the codes in arbitrary chunks through a DynamicCache gives the full forward's logits."""
    ids, a = codes(3 * P + 20, batch=2, seed=4), acts(4, batch=2, seed=4)
    with torch.no_grad():
        full = model(input_ids=ids, actions=a).logits
        cache, got, i = DynamicCache(config=model.config), [], 0
        for size in [37, 1, 26, 1, 63, 1, 1, 64, 18]:
            out = model(input_ids=ids[:, i : i + size], actions=a, past_key_values=cache, use_cache=True)
            got.append(out.logits)
            i += size
        assert i == ids.shape[1]
    got = torch.cat(got, dim=1)
    assert cache.get_seq_length() == full.shape[1] == 3 * FL + 20
    torch.testing.assert_close(got, full, rtol=0, atol=ATOL)


def test_generate_with_cache_matches_uncached_recomputation(model):
    """Decode steps' logits (KV cache, HF generate) equal a full forward over the same prefix: every
    step next to a frame boundary and every 16th between them.

    2 context frames, 3 generated: the decode steps feeding the last code of generated frames 2 and 3
    insert actions (two frame boundaries inside the cached decode), and the prefill inserts them
    after the context frames.
    """
    ctx, a = codes(2 * P, batch=2, seed=5), acts(5, batch=2, seed=5)
    n_new = 3 * P
    with torch.no_grad():
        out = model.generate(
            input_ids=ctx, actions=a, max_new_tokens=n_new, do_sample=False, eos_token_id=None,
            pad_token_id=512, output_logits=True, return_dict_in_generate=True,
        )
        seq = out.sequences
        assert seq.shape == (2, 2 * P + n_new)
        assert out.past_key_values.get_seq_length() == 2 * FL + 3 * P + 2 * A - 1  # last code never fed
        step_logits = torch.stack(out.logits, dim=1)  # [2, n_new, V]
        # every step next to a frame boundary (where actions are inserted) and every 16th between
        checked = sorted({j for k in range(1, 3) for j in (k * P - 1, k * P, k * P + 1)} | set(range(0, n_new, 16)) | {n_new - 1})
        for j in checked:
            prefix = seq[:, : 2 * P + j]
            full = model(input_ids=prefix, actions=a).logits[:, -1]
            torch.testing.assert_close(step_logits[:, j], full, rtol=0, atol=ATOL, msg=f"decode step {j}")
        # greedy: every token is the argmax of its step's logits
        assert torch.equal(seq[:, 2 * P :], step_logits.argmax(-1))


def test_next_frame_is_sampled_after_its_predecessors_actions(m1):
    """The fix of the seed's off-by-one: the first code of frame f+1 sees frame f's actions.

    Frame 2 is generated; its actions are inserted by the decode step that feeds its last code.
    Changing them must change the logits of frame 3's first code and nothing before it.
    """
    ctx, a = codes(2 * P, seed=6), acts(4, seed=6)
    b = a.clone()
    b[:, 2] += 2.0
    kw = dict(max_new_tokens=P + 1, do_sample=False, eos_token_id=None, pad_token_id=512,
              output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        la = torch.stack(m1.generate(input_ids=ctx, actions=a, **kw).logits, 1)
        lb = torch.stack(m1.generate(input_ids=ctx, actions=b, **kw).logits, 1)
    assert torch.equal(la[:, :P], lb[:, :P])
    assert (la[:, P] - lb[:, P]).abs().max() > 1e-3


def test_generate_needs_actions_only_up_to_the_second_last_new_frame(m1):
    ctx = codes(2 * P, seed=7)
    with torch.no_grad():
        out = m1.generate(input_ids=ctx, actions=acts(3, seed=7), max_new_tokens=2 * P, do_sample=False,
                          eos_token_id=None, pad_token_id=512)
        assert out.shape == (1, 4 * P)
        with pytest.raises(ValueError, match="actions cover 3 frames but 4 are needed"):
            m1.generate(input_ids=ctx, actions=acts(3, seed=7), max_new_tokens=2 * P + 1, do_sample=False,
                        eos_token_id=None, pad_token_id=512)


def test_hf_greedy_rollout_equals_placeholder_reference(model):
    """HF generate (cache, actions inserted in decode) == the vLLM-style recomputation, token for token."""
    ctx, a = codes(2 * P, seed=8).view(2, P), acts(4, seed=8)[0]
    got = hf_rollout(model, ctx, a, 2, SamplingConfig(temperature=0), progress=False)
    seq = ctx.reshape(1, -1)
    with torch.no_grad():
        for _ in range(2 * P):
            logits = reference_logits(model, seq, a[None])[:, -1]
            logits[:, 512] = float("-inf")
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(got.reshape(-1), seq[0, 2 * P :])


def test_generate_kwargs_turn_off_hf_defaults():
    layout = FrameLayout(image_tokens=64, vocab_size=513)
    kw = hf_generate_kwargs(SamplingConfig(temperature=0.9), layout)
    assert kw["top_k"] == 0 and kw["top_p"] == 1.0 and kw["do_sample"] and kw["eos_token_id"] is None
    assert kw["suppress_tokens"] == [512]
    assert hf_generate_kwargs(SamplingConfig(temperature=0), layout)["do_sample"] is False


def test_prepare_inputs_feeds_only_codes_missing_from_the_cache(m1):
    ids, a = codes(2 * P + 12, seed=9), acts(3, seed=9)
    cache = DynamicCache(config=m1.config)
    assert m1.prepare_inputs_for_generation(ids, past_key_values=cache, actions=a)["input_ids"].shape == (1, 2 * P + 12)
    with torch.no_grad():
        m1(input_ids=ids[:, : 2 * P + 10], actions=a, past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == 2 * FL + 10
    inputs = m1.prepare_inputs_for_generation(ids, past_key_values=cache, actions=a, cache_position=None)
    assert torch.equal(inputs["input_ids"], ids[:, 2 * P + 10 :])
    assert inputs["actions"] is a and inputs["logits_to_keep"] == 1
    assert "attention_mask" not in inputs and "position_ids" not in inputs and "cache_position" not in inputs
