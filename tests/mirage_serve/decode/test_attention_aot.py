"""The decode kernels compile ahead of time for sm_90 (no GPU): the attention's, for every mask kind and the
head shapes of the registry's models, with tensor-core MMAs in the attention kernel's PTX."""
from __future__ import annotations

import pytest

from superopt.runtime.interpreter import interpreting

pytestmark = pytest.mark.skipif(interpreting(), reason="kernels are interpreted in this process (TRITON_INTERPRET)")

PTR = {"bfloat16": "*bf16", "float16": "*fp16"}


def _compile(fn, types: dict, consts: dict, num_warps: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {n: "constexpr" if n in consts else types.get(n, "i32") for n in names}
    # pointers 16-byte aligned, as torch's allocations are when the JIT specialises them
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*")}
    src = ASTSource(fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


# (dtype, kv heads, group, head dim, mask kind, q/k norm form): Llama-3-8B, Qwen2.5-0.5B, Phi-3 (d 96), Gemma-2
# (d 256), Qwen3-8B, Gemma-3-1B (d 256, 1 + weight), OLMo-2-1B (MHA, cos/sin in float32)
CASES = [("bfloat16", 8, 4, 128, 1, 0), ("bfloat16", 2, 7, 64, 2, 0), ("float16", 32, 1, 96, 0, 0),
         ("bfloat16", 1, 8, 256, 1, 0), ("bfloat16", 8, 4, 128, 1, 1), ("bfloat16", 1, 4, 256, 1, 2),
         ("bfloat16", 16, 1, 128, 1, 0)]
SOFTCAP = {(1, 8, 256): 50.0}  # a Gemma head shape, with Gemma-2's attention logit softcapping
ROT = {(2, 7, 64): 16}  # partial rotary (StableLM-2's quarter of the head) on one of them
WIDE_ROPE = {(16, 1, 128)}  # RoPE in float32 from float32 cos/sin (OLMo-2's)


@pytest.mark.parametrize("dtype,hkv,group,d,mask,qk_norm", CASES)
def test_attention_kernels_compile_for_sm90(dtype, hkv, group, d, mask, qk_norm):
    from mirage_serve.decode.attention_kernels import BLOCK_N, _attend_split, _combine
    from triton import next_power_of_2 as _pow2

    t = PTR[dtype]
    block_d = max(16, _pow2(d))
    wide = (hkv, group, d) in WIDE_ROPE
    types = {n: t for n in ("q_ptr", "k_ptr", "v_ptr", "cos_ptr", "sin_ptr", "kc_ptr", "vc_ptr", "qn_ptr", "kn_ptr")}
    types.update({"cos_ptr": "*fp32", "sin_ptr": "*fp32"} if wide else {})
    types.update({"pos_ptr": "*i64", "mask_ptr": {0: "*i64", 1: "*i1", 2: t}[mask],
                  "o_ptr": "*fp32", "m_ptr": "*fp32", "l_ptr": "*fp32", "scale": "fp32", "eps": "fp32"})
    pdl = mask != 0  # both ways: with programmatic dependent launch (as on sm_90+) and without
    k = _compile(_attend_split, types, dict(HKV=hkv, GROUP=group, D=d, BLOCK_G=max(16, _pow2(group)),
                                            BLOCK_D=block_d, BLOCK_N=BLOCK_N, MASK_KIND=mask, QK_NORM=qk_norm,
                                            PDL=pdl, ROT=ROT.get((hkv, group, d), d),
                                            SOFTCAP=SOFTCAP.get((hkv, group, d), 0.0), ROPE_WIDE=int(wide),
                                            ONE_TILE=int(mask != 2)), 4)  # (slices of one tile, and longer)
    assert k.asm["cubin"] and "mma.sync" in k.asm["ptx"]  # q·Kᵀ and p·V on tensor cores
    c = _compile(_combine, {"o_ptr": "*fp32", "m_ptr": "*fp32", "l_ptr": "*fp32", "out_ptr": t, "len_ptr": "*i64"},
                 dict(HQ=hkv * group, D=d, SPLITS=5, BLOCK_S=8, BLOCK_D=block_d, ADVANCE=True, PDL=pdl),
                 4 if pdl else 1)  # (LaunchPlan.combine_warps: the default 1, and more)
    assert c.asm["cubin"]
    for kernel in (k, c):
        ptx = kernel.asm["ptx"]
        assert ("griddepcontrol.wait" in ptx) == pdl and ("griddepcontrol.launch_dependents" in ptx) == pdl
    if pdl and mask != 2:  # a one-tile slice's cache tile is loaded while the predecessor runs; nothing is stored
        before = k.asm["ptx"].split("griddepcontrol.wait")[0]
        assert "ld.global" in before and "st.global" not in before and "atom" not in before


def test_greedy_kernels_compile_for_sm90():
    """The decode loop's token choice and bookkeeping (greedy_kernels), which also stores the next step's mask column
    into a bool tensor: built for sm_90 as the GPU builds them."""
    from mirage_serve.decode.greedy_kernels import BLOCK, CHUNK, NONE, _choose_and_book, _partial_argmax

    p = _compile(_partial_argmax, {"logits_ptr": "*bf16", "eos_ptr": "*i1", "t_ptr": "*i64", "min_new_ptr": "*i64",
                                   "val_ptr": "*fp32", "idx_ptr": "*i32", "nan_ptr": "*i32"},
                 dict(CHUNK=CHUNK, BLOCK=BLOCK, NONE=NONE), 4)
    longs = ("pad_ptr", "tokens_ptr", "ids_ptr", "t_ptr", "generated_ptr", "pos_ptr", "slot_ptr")
    kinds = {"val_ptr": "*fp32", "idx_ptr": "*i32", "nan_ptr": "*i32", "unfinished_ptr": "*i1", "eos_ptr": "*i1",
             "mask_ptr": "*i1", **{n: "*i64" for n in longs}}
    # with and without the next step's embedding and rotary rows (step_inputs, rotary_table.fold_into)
    c = _compile(_choose_and_book, dict(kinds, emb_ptr="*fp32", embeds_ptr="*fp32", rot_ptr="*fp32", rows_ptr="*fp32"),
                 dict(BLOCK_B=8, BLOCK_S=64, NONE=NONE, EMBED=False, BLOCK_H=512, ROT=False, BLOCK_R=16), 4)
    e = _compile(_choose_and_book, dict(kinds, emb_ptr="*bf16", embeds_ptr="*bf16", rot_ptr="*fp32", rows_ptr="*fp32"),
                 dict(BLOCK_B=8, BLOCK_S=64, NONE=NONE, EMBED=True, BLOCK_H=512, ROT=True, BLOCK_R=256), 4)
    assert p.asm["cubin"] and c.asm["cubin"] and e.asm["cubin"]
