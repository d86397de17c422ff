"""The decode-attention fast path in Triton's CPU interpreter; prints one JSON line of results.

Run as ``python -m tests.mirage_serve.decode.attention_interp_run [PART PARTS]`` in its own process (TRITON_INTERPRET
must be set before triton is imported); with PART and PARTS, only every PARTS-th case from the PART-th on (the test
runs the parts side by side, one process a core). Two kinds of case:

* ``kernel/<case>/<dtype>``: ``decode_attention`` against a float64 reference on random inputs —
  relative error of the output, of the written cache slot, whether every other slot is untouched
  and whether the length counter advanced by one;
* ``family/<name>``: a tiny random model of each family, fp32, a left-padded batch of 3 decoded
  for 16 steps on a static cache with the fast path installed, against the same model without it
  — tokens identical, logits close, how many steps took the fast path, the first-use verdicts;
  ``family/llama_patched`` goes through ``mirage_serve.patch`` (sites + attention; ``_residual``
  with the residual adds in the projections; ``qwen3_patched`` as the defaults run Qwen3: residual adds fused,
  q/k norms in the attention kernel), and
  ``family/gemma3_small_window`` has sliding layers whose window fills (they keep HF's forward),
  ``family/granite_traced`` is a family with no adapter (its attention found by ``find_attention``),
  ``gemma2_patched`` / ``phi3_window_patched`` run everything patch() installs on those families (sites,
  residual adds with Gemma's post-norms in the projections, softcapped / sliding-window attention), and
  ``family/llama_mutant`` runs a deliberately wrong kernel (scale off by 10%) that the first-use
  check must refuse, with the tokens still right.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

from tests.mirage_serve.decode.attention_cases import (FAMILIES, GRANITE, KERNEL_CASES, OLMO2_SEARCHED,  # noqa: E402
                                                       SMALL_WINDOW, STABLELM, family_case, kernel_case)


def main(part: int = 0, parts: int = 1) -> None:
    cases = [(f"kernel/{name}/{dtype}", kernel_case, (*case, dtype))
             for name, case in KERNEL_CASES.items() for dtype in ("float32", "float16")]
    families = [(n, c, "install") for n, c in FAMILIES.items()]
    families += [("llama_patched", FAMILIES["llama"], "patch"), ("llama_mutant", FAMILIES["llama"], "mutant"),
                 ("llama_patched_residual", FAMILIES["llama"], "patch_residual"),
                 ("llama_unpadded", FAMILIES["llama"], "unpadded"),
                 ("qwen3_patched", FAMILIES["qwen3"], "patch_residual"),
                 ("gemma3_small_window", SMALL_WINDOW, "install"), ("granite_traced", GRANITE, "patch"),
                 ("gemma2_patched", FAMILIES["gemma2"], "patch_residual"), ("stablelm_traced", STABLELM, "patch"),
                 ("phi3_window_patched", FAMILIES["phi3_window"], "patch_residual"),
                 ("olmo2_patched", OLMO2_SEARCHED, "patch_searched")]
    # the searched attention μGraphs in patch() (searched here, on the CPU, then run in the interpreter): GQA,
    # Gemma-2's softcap, eager float mask and sliding layers, Qwen3's q/k norms in the program
    families += [(f"{n}_searched", FAMILIES[n], "patch_searched_attention") for n in ("llama", "gemma2", "qwen3")]
    for name, config, how in families:
        attention = "profiled" if how == "patch_searched_attention" else "hand-written"
        cases.append((f"family/{name}", family_case, (name, config, how.replace("_attention", ""), attention)))
    result = {}
    for key, run, args in cases[part::parts]:
        try:
            result[key] = run(*args)
        except Exception as e:  # reported per case, so one failure does not hide the others
            result[key] = f"{type(e).__name__}: {e}"
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main(*map(int, sys.argv[1:3])))
