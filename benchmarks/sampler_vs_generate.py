"""Sampler speed: lopti_minimal.sampling.sample_groups (its default decoder: decode.py's
lean loop on a CPU) vs transformers `generate`.

    python benchmarks/sampler_vs_generate.py [THREADS=1] [PRESET=tiny]

Same randomly initialised tiny-preset model (vocab 1024), 8 prompts of 60-100 tokens,
G = 8 responses each, 128 new tokens, temperature 0.7; prints tokens/s of both, twice
each (the first call of each warms up).  A figure-printing benchmark, not a test.
"""
import sys, time, torch
from lopti_minimal.models import make_tiny_model
from lopti_minimal.batch import left_pad
from lopti_minimal.sampling import sample_groups
torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
preset = sys.argv[2] if len(sys.argv) > 2 else "tiny"
model = make_tiny_model(preset, 1024).eval()
EOS, PAD = 2, 0
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(3, 1024, (int(n),), generator=g).tolist() for n in torch.randint(60, 100, (8,), generator=g)]
G, R = 8, 128
def ours():
    r = sample_groups(model, prompts, G, R, temperature=0.7, eos_token_id=EOS, pad_token_id=PAD,
                      generator=torch.Generator().manual_seed(1))
    return int(r.response_mask.sum())
ids, am = left_pad(prompts, PAD)
ids, am = ids.repeat_interleave(G, 0), am.repeat_interleave(G, 0)
def hf():
    torch.manual_seed(1)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=am, do_sample=True, temperature=0.7,
                             top_k=0, top_p=1.0, max_new_tokens=R, eos_token_id=EOS, pad_token_id=PAD)
    resp = out[:, ids.shape[1]:]
    # tokens up to and including the first EOS
    n = 0
    for row in resp.tolist():
        n += row.index(EOS) + 1 if EOS in row else len(row)
    return n
for name, fn in (("ours", ours), ("generate", hf), ("ours", ours), ("generate", hf)):
    t = time.perf_counter(); n = fn(); dt = time.perf_counter() - t
    print(f"{name:9s} {preset} B={len(prompts)*G} R<={R}: {n} tokens in {dt:.2f}s = {n/dt:.0f} tok/s")
