"""Train a shipped teacher on the corpus's TRAIN split (CPU, seeded): the tiny Qwen2 (with its tokenizer) or the deeper Qwen3.

`python scripts/train_teacher.py` writes `taylor_calibrate/data/teacher/` (config, bf16 safetensors
weights, tokenizer) and `taylor_calibrate/data/teacher/training_log.json` (loss curve, held-out
VALID loss, wall time, and at every evaluation the heads' mean attention distance and an induction probe).
`RECIPE` is the recipe the shipped Qwen2 teacher (`tiny-qwen2`) was trained with.

`python scripts/train_teacher.py --recipe tiny-qwen3 --threads 1 --checkpoint-dir runs/tiny-qwen3` trains the
Qwen3 teacher (`QWEN3_RECIPE`) into `taylor_calibrate/data/teacher_qwen3/`. It reuses the shipped tokenizer and
tokenises every split with exactly the pipeline the saved folder loads with (`AutoTokenizer` on the output
folder, then `taylor_calibrate.teacher.corpus_token_ids`). With `--checkpoint-dir` the run writes a checkpoint
(weights, optimiser, data sampler, log) every `--checkpoint-every` seconds and, started again with the same
arguments, continues from the last one bit for bit.

The same script runs on a CUDA GPU (`--device cuda`, bf16 autocast, `--out` elsewhere): `bench/device_check.py`
uses it to measure how many tokens this size of teacher needs before a head's mean distance drops below 3 tokens.
"""
import argparse, contextlib, gzip, json, math, os, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT/'taylor_calibrate'/'data'/'corpus'
OUT = ROOT/'taylor_calibrate'/'data'/'teacher'

RECIPE = dict(arch='qwen2', vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=8,
              num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
              seq_len=512, batch_size=8, lr=1.5e-3, min_lr=1e-4, warmup=50, weight_decay=0.1,
              steps=500, seed=0, eval_every=100)
QWEN3_RECIPE = dict(arch='qwen3', hidden_size=256, intermediate_size=768, num_hidden_layers=12, num_attention_heads=8,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=1024, seq_len=512, batch_size=8, lr=2e-3,
                    min_lr=1e-4, warmup=50, weight_decay=0.1, steps=1100, seed=0, eval_every=100)
RECIPES = {'tiny-qwen2': RECIPE, 'tiny-qwen3': QWEN3_RECIPE}
OUTS = {'tiny-qwen2': OUT, 'tiny-qwen3': OUT.parent/'teacher_qwen3'}

def read_split(split):
    with gzip.open(CORPUS/f'{split}.jsonl.gz', 'rt', encoding='utf-8') as f: return [json.loads(l)['text'] for l in f]

def train_tokenizer(texts, vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, processors
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=['<|endoftext|>'],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token='<|endoftext|>', bos_token='<|endoftext|>',
                                   unk_token='<|endoftext|>', pad_token='<|endoftext|>', model_max_length=1024)

def token_stream(tok, texts):
    ids = []
    for t in texts: ids.extend(tok(t)['input_ids'] + [tok.eos_token_id])
    return torch.tensor(ids, dtype=torch.long)

@torch.no_grad()
def eval_loss(model, ids, seq_len, max_windows=64):
    model.eval()
    n = min(max_windows, (len(ids) - 1)//seq_len)
    x = ids[:n*seq_len].view(n, seq_len).to(model.device)
    losses = [model(input_ids=x[i:i+8], labels=x[i:i+8]).loss.item() for i in range(0, n, 8)]
    model.train()
    return sum(losses)/len(losses)

@torch.no_grad()
def head_probe(model, ids, seq_len, windows=4, repeat=100, seed=0):
    """Per-head mean attention distance (mean over queries of sum_s p(t,s)(t-s)) and share of attention mass within 2
    tokens on the first `windows` VALID windows, and an induction probe: the loss on a second copy of `repeat` random tokens vs the first copy."""
    from taylor_calibrate.teacher import attention_maps
    model.eval()
    x = ids[:windows*seq_len].view(windows, seq_len).to(model.device)
    pos = torch.arange(seq_len, device=model.device)
    dist = (pos[:, None] - pos[None, :]).clamp(min=0).float()
    maps = attention_maps(model, x).float()                              # [layers, batch, heads, T, T]
    md = (maps*dist).sum(-1).mean((1, 3))                                # [layers, heads]
    near = (maps*(dist <= 2)).sum(-1).mean((1, 3))                       # share of each head's mass within 2 tokens
    r = torch.randint(1, model.config.vocab_size, (windows, repeat), generator=torch.Generator().manual_seed(seed))
    xr = torch.cat([r, r], 1).to(model.device)
    nll = -torch.log_softmax(model(input_ids=xr).logits[:, :-1].float(), -1).gather(-1, xr[:, 1:, None])[..., 0]
    model.train()
    (lo_l, lo_h), (hi_l, hi_h) = (divmod(int(i), md.shape[1]) for i in (md.argmin(), md.argmax()))
    return dict(min_mean_distance=round(md.min().item(), 3), min_head=[lo_l, lo_h], max_mean_distance=round(md.max().item(), 3),
                max_head=[hi_l, hi_h], repeat_loss_first=round(nll[:, :repeat-1].mean().item(), 3),
                repeat_loss_second=round(nll[:, repeat:].mean().item(), 3), max_mass_within_2=round(near.max().item(), 3),
                max_mass_within_2_head=list(divmod(int(near.argmax()), near.shape[1])))

def qwen3_tokenizer(out):
    "The shipped tokenizer, saved into `out` next to the Qwen3 config and loaded back from there (the pipeline every user gets)."
    from transformers import AutoTokenizer
    AutoTokenizer.from_pretrained(OUT).save_pretrained(out)
    return AutoTokenizer.from_pretrained(out)

def training_token_ids(out):
    "The tokenizer saved in `out` and the TRAIN and VALID token streams it gives through the package's corpus pipeline."
    from taylor_calibrate.teacher import corpus_token_ids
    Path(out).mkdir(parents=True, exist_ok=True)
    tok = qwen3_tokenizer(out)
    key = tok.backend_tokenizer.to_str()              # the same tokenizer gives the same streams: tokenise once per process
    if key not in _STREAMS: _STREAMS[key] = corpus_token_ids(tok, 'train'), corpus_token_ids(tok, 'valid')
    return (tok, *_STREAMS[key])

_STREAMS = {}

def build_model(r, tok):
    "A freshly initialised causal LM of the recipe's architecture (seeded by the caller)."
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    common = dict(vocab_size=len(tok), hidden_size=r['hidden_size'], intermediate_size=r['intermediate_size'],
                  num_hidden_layers=r['num_hidden_layers'], num_attention_heads=r['num_attention_heads'],
                  num_key_value_heads=r['num_key_value_heads'], max_position_embeddings=r['max_position_embeddings'],
                  tie_word_embeddings=True, bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                  pad_token_id=tok.eos_token_id)
    if r.get('arch', 'qwen2') == 'qwen2':
        cfg = Qwen2Config(**common, rope_theta=10000.0, attn_implementation='sdpa')
        return Qwen2ForCausalLM(cfg)
    cfg = Qwen3Config(**common, head_dim=r['head_dim'], rope_parameters=dict(rope_type='default', rope_theta=10000.0),
                      attention_bias=False)
    cfg._attn_implementation = 'sdpa'
    return Qwen3ForCausalLM(cfg)

def save_checkpoint(ckpt_dir, state):
    "Write a checkpoint atomically: a temporary file renamed over `checkpoint.pt`."
    ckpt_dir = Path(ckpt_dir); ckpt_dir.mkdir(parents=True, exist_ok=True)
    tmp = ckpt_dir/'checkpoint.pt.tmp'
    torch.save(state, tmp)
    os.replace(tmp, ckpt_dir/'checkpoint.pt')

def main(r=RECIPE, threads=2, continue_from=None, device='cpu', out=OUT, max_seconds=None, checkpoint_dir=None,
         checkpoint_every=600., stop_after=None):
    """Train the recipe `r` and save it to `out`. With `checkpoint_dir`, checkpoint every `checkpoint_every` seconds and
    resume from a checkpoint found there; `stop_after` ends the run (checkpointed, nothing saved to `out`) after that step."""
    from transformers import Qwen2ForCausalLM, AutoTokenizer
    torch.set_num_threads(threads); torch.manual_seed(r['seed'])
    t0 = time.time()
    out = Path(out)
    qwen3 = r.get('arch', 'qwen2') == 'qwen3'
    if qwen3: tok, train_ids, valid_ids = training_token_ids(out)
    else:
        train_texts, valid_texts = read_split('train'), read_split('valid')
        tok = AutoTokenizer.from_pretrained(continue_from) if continue_from else train_tokenizer(train_texts, r['vocab_size'])
        train_ids, valid_ids = token_stream(tok, train_texts), token_stream(tok, valid_texts)
    print(f'tokenizer: {len(tok)} tokens; train {len(train_ids):,} tokens, valid {len(valid_ids):,} tokens ({time.time()-t0:.0f}s)', flush=True)
    model = build_model(r, tok)
    previous = None
    if continue_from:  # a further stage from saved weights: same architecture, new optimiser and schedule
        model = Qwen2ForCausalLM.from_pretrained(continue_from, dtype=torch.float32)
        previous = json.loads((Path(continue_from)/'training_log.json').read_text())
    device = torch.device(device); model.to(device)
    amp = torch.autocast('cuda', dtype=torch.bfloat16) if device.type == 'cuda' else contextlib.nullcontext()
    print(f'teacher: {sum(p.numel() for p in model.parameters()):,} parameters', flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': r['weight_decay']}, {'params': no_decay, 'weight_decay': 0.}],
                            lr=r['lr'], betas=(0.9, 0.95))
    def lr_at(s):
        if s < r['warmup']: return r['lr']*(s+1)/r['warmup']
        p = (s - r['warmup'])/max(1, r['steps'] - r['warmup'])
        return r['min_lr'] + 0.5*(r['lr'] - r['min_lr'])*(1 + math.cos(math.pi*p))
    g = torch.Generator().manual_seed(r['seed'])
    L, B = r['seq_len'], r['batch_size']
    log = dict(recipe=r, device=str(device), steps=[], loss=[], eval_steps=[], valid_loss=[], heads=[], tokens_per_step=B*L)
    start, elapsed = 0, 0.
    ckpt = Path(checkpoint_dir)/'checkpoint.pt' if checkpoint_dir else None
    if ckpt is not None and ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        if state['recipe'] != r: raise ValueError(f'{ckpt} was written by another recipe: {state["recipe"]}')
        model.load_state_dict(state['model']); opt.load_state_dict(state['optimizer']); g.set_state(state['sampler'])
        torch.set_rng_state(state['torch_rng'])
        start, elapsed, log = state['step'], state['elapsed'], state['log']
        log.setdefault('resumed_at', []).append(start)
        print(f'resumed from {ckpt} at step {start} ({elapsed:.0f}s of training before)', flush=True)
    def checkpoint(step):
        save_checkpoint(checkpoint_dir, dict(recipe=r, step=step, elapsed=elapsed + time.time() - t1, log=log, model=model.state_dict(),
                                             optimizer=opt.state_dict(), sampler=g.get_state(), torch_rng=torch.get_rng_state()))
    t1 = time.time(); last_ckpt = t1; model.train()
    for s in range(start, r['steps']):
        starts = torch.randint(0, len(train_ids) - L - 1, (B,), generator=g)
        x = torch.stack([train_ids[i:i+L] for i in starts.tolist()]).to(device)
        for grp in opt.param_groups: grp['lr'] = lr_at(s)
        with amp: loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True); loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
        log['steps'].append(s); log['loss'].append(round(loss.item(), 4))
        if s % 20 == 0: print(f'step {s} loss {loss.item():.3f} lr {lr_at(s):.2e} {B*L*(s+1-start)/(time.time()-t1):.0f} tok/s', flush=True)
        over_time = max_seconds is not None and elapsed + time.time() - t1 > max_seconds
        if (s+1) % r['eval_every'] == 0 or s+1 == r['steps'] or over_time:
            with amp: vl, hp = eval_loss(model, valid_ids, L), head_probe(model, valid_ids, L)
            log['eval_steps'].append(s+1); log['valid_loss'].append(round(vl, 4)); log['heads'].append(dict(step=s+1, **hp))
            print(f'step {s+1} valid loss {vl:.3f} (ppl {math.exp(vl):.1f}); heads: {hp}', flush=True)
        if over_time: log['stopped_early'] = f'--max-seconds {max_seconds} reached after {s+1} steps'; break
        if ckpt is not None and (time.time() - last_ckpt > checkpoint_every or s+1 == stop_after):
            checkpoint(s+1); last_ckpt = time.time()
        if stop_after is not None and s+1 == stop_after: print(f'stopped after step {s+1} (checkpointed)', flush=True); return log
    log['train_seconds'] = round(elapsed + time.time() - t1, 1); log['train_tokens'] = len(log['steps'])*B*L
    if previous:  # one log over all stages: steps and tokens continue where the previous stage ended
        off = previous['steps'][-1] + 1
        log = dict(stages=previous.get('stages', [previous['recipe']]) + [r], recipe=r, tokens_per_step=B*L,
                   steps=previous['steps'] + [off + s for s in log['steps']], loss=previous['loss'] + log['loss'],
                   eval_steps=previous['eval_steps'] + [off + s for s in log['eval_steps']],
                   valid_loss=previous['valid_loss'] + log['valid_loss'],
                   heads=previous.get('heads', []) + [dict(h, step=off + h['step']) for h in log['heads']],
                   train_seconds=previous['train_seconds'] + log['train_seconds'], train_tokens=previous['train_tokens'] + log['train_tokens'])
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out/'training_log.json').write_text(json.dumps(log))
    print(f'saved to {out} after {time.time()-t0:.0f}s', flush=True)
    return log

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--recipe', default='tiny-qwen2', choices=list(RECIPES), help='which shipped teacher to train')
    p.add_argument('--steps', type=int, default=None)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--lr', type=float, default=None)
    p.add_argument('--warmup', type=int, default=None)
    p.add_argument('--seed', type=int, default=None)
    p.add_argument('--batch-size', type=int, default=None)
    p.add_argument('--eval-every', type=int, default=None)
    p.add_argument('--continue-from', default=None, help='train a further stage from the weights and tokenizer in this folder')
    p.add_argument('--device', default='cpu', help="'cpu' (the shipped recipe) or 'cuda' (bf16 autocast)")
    p.add_argument('--out', default=None, help='folder to write the teacher to (default: its package data folder)')
    p.add_argument('--max-seconds', type=float, default=None, help='stop (and evaluate) once training has run this long')
    p.add_argument('--checkpoint-dir', default=None, help='checkpoint here, and resume from a checkpoint found here')
    p.add_argument('--checkpoint-every', type=float, default=600., help='seconds between checkpoints')
    p.add_argument('--stop-after', type=int, default=None, help='end the run after this step with a checkpoint (to be resumed)')
    a = p.parse_args()
    given = dict(steps=a.steps, lr=a.lr, warmup=a.warmup, seed=a.seed, batch_size=a.batch_size, eval_every=a.eval_every)
    r = {**RECIPES[a.recipe], **{k: v for k, v in given.items() if v is not None}}
    main(r, a.threads, a.continue_from, a.device, a.out or OUTS[a.recipe], a.max_seconds, a.checkpoint_dir, a.checkpoint_every, a.stop_after)
