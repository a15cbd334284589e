"""Does the query still find the needle? The attention the last prompt token pays to the needle's value tokens, in each
attention layer a hybrid keeps, against the teacher's in the same layer, on the retrieval prompts of
`retrieval_breakage.py` (VALID or generated filler; the layers fitted by Phase 1 by least squares on TRAIN).

    python scripts/needle_attention.py --teacher smollm2-135m --checkpoints DIR   # -> bench/results/needle_attention_smollm2-135m.json

The question's last token is the one that predicts the answer's first token. For each kept layer the script records,
per prompt, the largest share any head of that layer puts on the needle's value tokens (the value as it appears inside
the needle sentence), and the mean over prompts; the same for the teacher at the same layers. A kept layer whose heads
still reach the needle while the answer is lost says the value's representation is gone by the time the head reads it;
a kept layer whose heads no longer reach it says the query lost its way.
"""
import argparse, json, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]

def find(seq: list, sub: list) -> int:
    "Start of the last occurrence of `sub` in `seq`, or -1."
    for i in range(len(seq) - len(sub), -1, -1):
        if seq[i:i + len(sub)] == sub: return i
    return -1

@torch.no_grad()
def needle_shares(model, layers, prompts) -> dict:
    "Per layer in `layers`: per prompt, the largest share of the last token's attention any head puts on the needle's value tokens."
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv
    grabbed, hooks = {}, []
    def hook(l):
        def f(mod, args, kwargs):
            x = kwargs.get('hidden_states', args[0] if args else None)
            cos, sin = kwargs['position_embeddings']
            B, T, _ = x.shape
            q = mod.q_proj(x).view(B, T, -1, mod.head_dim).transpose(1, 2)
            k = mod.k_proj(x).view(B, T, -1, mod.head_dim).transpose(1, 2)
            if hasattr(mod, 'q_norm'): q, k = mod.q_norm(q), mod.k_norm(k)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            k = repeat_kv(k, q.shape[1] // k.shape[1])
            s = (q[:, :, -1:] @ k.transpose(-1, -2)).float() * mod.scaling          # the last token's scores over every key
            grabbed[l] = s.softmax(-1)[0, :, 0]                                       # [heads, T]
        return f
    for l in layers:
        hooks.append(model.model.layers[l].self_attn.register_forward_pre_hook(hook(l), with_kwargs=True))
    out = {l: [] for l in layers}
    try:
        for p, span in prompts:
            grabbed.clear(); model(p[None])
            for l in layers: out[l].append(grabbed[l][:, span[0]:span[1]].sum(-1).max().item())
    finally:
        for h in hooks: h.remove()
    return {l: dict(per_prompt=v, mean=sum(v) / len(v)) for l, v in out.items()}

def main(a):
    import sys
    sys.path.insert(0, str(ROOT/'scripts'))
    from retrieval_breakage import retrieval_prompts, fitted_states, hybrid_with
    from taylor_calibrate.teacher import load_teacher
    torch.set_num_threads(a.threads)
    teacher, tok = load_teacher(a.teacher)
    n = teacher.config.num_hidden_layers
    t0 = time.time()
    states = fitted_states(teacher, tok, Path(a.checkpoints) if a.checkpoints else None)
    prompts = []
    for p, ans in retrieval_prompts(tok, a.prompts, a.length):
        at = find(p.tolist(), ans.tolist())
        if at >= 0: prompts.append((p, (at, at + len(ans))))
    out = dict(teacher_name=a.teacher, prompts=len(prompts), length=a.length, sets={})
    for kept in a.sets.split(';'):
        keep = [int(x) for x in kept.split(',')]
        h = hybrid_with(teacher, states, [l for l in range(n) if l not in keep])
        out['sets'][kept] = dict(teacher=needle_shares(teacher, keep, prompts), hybrid=needle_shares(h, keep, prompts))
        for l in keep:
            print(f"kept {kept}, layer {l:2d}: needle share teacher {out['sets'][kept]['teacher'][l]['mean']:.3f}, "
                  f"hybrid {out['sets'][kept]['hybrid'][l]['mean']:.3f}", flush=True)
    out['seconds'] = time.time() - t0
    path = ROOT/'bench'/'results'/f'needle_attention_{a.teacher}.json'
    path.write_text(json.dumps(out, indent=1)); print('wrote', path)

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--teacher', default='smollm2-135m')
    p.add_argument('--prompts', type=int, default=8)
    p.add_argument('--length', type=int, default=1536, help='prompt length in tokens')
    p.add_argument('--sets', default='0,3,7,11,15,18,22,26;0,1,2,16,17,18,23,24',
                   help="kept sets, ';'-separated (default: uniform's and the breakage map's at 8 of 30)")
    p.add_argument('--threads', type=int, default=1)
    p.add_argument('--checkpoints', default=None, help='the fitted layers of retrieval_breakage.py (fitted again where missing)')
    main(p.parse_args())
