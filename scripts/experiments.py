"""The paper's experiments at small scale on the shipped teacher: zero-shot grid, retention sweep,
recovery distillation, and the GQA-copy ablation. Calibration on TRAIN, layer selection on VALID, evaluation on TEST.

    python scripts/experiments.py --mini --out-dir /tmp/exp        # a few steps of everything (CI smoke run)
    python scripts/experiments.py --workers 2                      # the full run -> bench/results/experiments/
    python scripts/experiments.py --parts grid,gqa --seeds 1       # a subset
    python scripts/experiments.py --teacher tiny-qwen3 --workers 2 # the same on the Qwen3 teacher -> bench/results/experiments_tiny-qwen3/
    python scripts/experiments.py --mixer kda --parts uniform      # KDA layers instead of GDN, the uniform row -> bench/results/experiments_kda/

Every finished run is appended as one JSON line to `<out-dir>/runs.jsonl` (the ledger); a run already in the
ledger is never repeated, so an interrupted script resumes where it stopped, and runs shared by two parts
(the retention sweep's 25% row and the GQA ablation's correct copy are grid cells) are computed once.
`--workers N` starts N processes that take runs from one list (claimed through files, so no run is done
twice) and split the CPU between them. At the end the ledger is summarised into `<out-dir>/experiments.json`,
which the results notebook reads. Recovery budget: `--recovery-tokens` per init (the same for every init);
validation perplexity on VALID. `--parts uniform` is the grid's uniform row alone (every seed), the part run for
each mixer (`--mixer`). `--parts ablation` (not run by default) turns each of taylor+'s switches off in turn,
at 25% kept, uniform and retrieval policies (the latter converts layers 0 to 2 of SmolLM2), seed 0; `--parts budget` (not run by default) runs taylor+ with a larger cap on Phase 2's
steps (its early stopping on held-out calibration tokens decides where it stops), and with larger learning rates, at seed 0,
and on the retrieval policy's layers taylor+ with 300 steps and the older recipe ('older taylor+') with 100
(like the ablation, at later seeds too when --seeds asks, after everything else); `--parts mechanism` (not run by default)
measures what Phase 1 does for Phase 2: Phase 2 from the copy and from Phase 1, under the paper's and taylor+'s budgets,
capped at 30 and 100 steps as well as 300, and the paper's inits on the teacher rescaled to value/output gauges 10 and 100
(the same function); taylor+ without Phase 1 at every seed;
`--parts policy-retention` (not run by default) runs naive, taylor and taylor+ at 50% kept with the AR, retrieval and GA-S2 policies, each ranking the layers
by the scores its 25% run measured (for the long-context probes, which need the layers to carry state). Every zero-shot run also records
its VALID perplexity, on which a recipe is chosen; TEST is only reported. `--reproduce REGEX` runs the ledger's matching runs
again from scratch (on the layers each kept) and records both TEST perplexities in `<out-dir>/reproduced.jsonl`: the committed
grid, regenerated.
"""
import argparse, hashlib, json, os, shutil, statistics, subprocess, sys, time
from pathlib import Path
import torch

ROOT = Path(__file__).resolve().parents[1]
INITS = ('naive', 'zero_gate', 'taylor_phase1', 'phase2', 'taylor', 'phase1', 'taylor+')
POLICIES = ('uniform:0.25', 'ar:0.25', 'ga-s2:0.25', 'retrieval:0.25')
RECOVERY_INITS = ('naive', 'zero_gate', 'taylor', 'taylor+')
RETENTION = (0.25, 0.5, 0.75)
RETENTION_INITS = ('naive', 'taylor', 'taylor+')
POLICY_RETENTION = ('ar', 'retrieval', 'ga-s2')    # part 'policy-retention': these policies at 50% kept too, their layers ranked by the 25% runs' scores
ABLATED = ('phase1', 'fit', 'minibatch')       # taylor+'s switches, each turned off in turn (part 'ablation')
ADDED = ('gauge_fix',)                          # switches taylor+ lacks, each turned on in turn (part 'ablation')
ABLATION_POLICIES = ('uniform:0.25', 'retrieval:0.25')   # part 'ablation' on uniform's layers and on the retrieval policy's (layers 0 to 2 converted)
LATER_FIELDS = {'constant_gate': False, 'fit': False}   # recipe fields younger than the ledgers: left out of a fingerprint at their default
# Two names changed meaning when Phase 1 by least squares arrived: 'phase1' was the paper's Phase 1 alone (now 'taylor_phase1'),
# and 'taylor+' started from the paper's mappings. Rows written before fingerprints carry these recipes' fingerprints, and
# rows of the paper's Phase 1 under its old name are read under its new one (`relabel`).
LEGACY_IDS = {'phase1': '5f95d6d30034', 'taylor+': 'd8dddfa40a8b'}
RENAMED = ('phase1', 'taylor_phase1')
OLDER_TAYLOR = dict(fit=False, exact_decay=True, exact_beta=True, gauge_fix=True, steps=300)   # 'older taylor+': what 'taylor+' named before
                                                # Phase 1 by least squares (the paper's Phase 1 at the balanced gauge; fingerprint LEGACY_IDS['taylor+'])
STEP_CAPS = (300, 1000)                         # Phase 2's step cap for taylor+ in part 'budget' (its own: 100)
RATE_FACTORS = (4,)                             # Phase 2's two learning rates times N for taylor+ in part 'budget' (scripts/phase2_rate.py)
MECHANISM_STEPS = (30, 100)                     # part 'mechanism': Phase 2 capped at these steps (the paper's own: 300; taylor+'s: 100) ...
MECHANISM_INITS = ('phase2', 'taylor', 'taylor+ without phase1', 'taylor+ without fit', 'taylor+')   # ... from the copy, the paper's Phase 1, ours
GAUGES = (10, 100)                              # part 'mechanism': the teacher rescaled to these value/output gauges (the same function)
GAUGE_INITS = ('naive', 'taylor_phase1', 'phase2', 'taylor')
TARGETS = (1.05, 1.1, 1.25, 1.5, 2.0)          # recovery targets, x teacher validation perplexity (the paper's metric uses 1.25-2x)

# ----- the list of runs -----
def zero_shot_job(keep, init, seed, kv_copy='heads'): return dict(kind='zero_shot', keep=keep, init=init, seed=seed, kv_copy=kv_copy)
def recovery_job(init): return dict(kind='recovery', init=init, keep='uniform:0.25', seed=0)
BUDGET_INITS = (*(f'taylor+ with steps={n}' for n in STEP_CAPS), *(f'taylor+ with rates x{f}' for f in RATE_FACTORS))
BUDGET_RETRIEVAL = (f'taylor+ with steps={STEP_CAPS[0]}', 'older taylor+ with steps=100')   # ... and on the retrieval policy's layers, with the
                                                # older recipe at taylor+'s own cap beside them
def job_key(job): return '|'.join(f'{k}={job[k]}' for k in sorted(job))

def jobs(parts, seeds, mini=False):
    """Every run the requested parts need, most informative and cheapest first: seed 0 of the uniform and AR rows, GQA,
    the retention sweep and the retrieval row; the uniform row's other seeds; recovery; the taylor+ ablation (seed 0); seed 0 of GA-S2 (its selection calibrates one probe
    per layer); the other seeds of everything else, the ablation's last."""
    policies = POLICIES[:2] if mini else POLICIES
    row = lambda p, s: ([zero_shot_job(p, i, s) for i in INITS] if ('grid' in parts and p in policies) or ('uniform' in parts and p == 'uniform:0.25')
                        else [])
    gqa = lambda s: [zero_shot_job('uniform:0.25', 'taylor', s, kv) for kv in ('heads', 'rows_bug')] if 'gqa' in parts else []
    retention = lambda s: [zero_shot_job(f'uniform:{f}', i, s) for f in RETENTION for i in RETENTION_INITS] if 'retention' in parts else []
    half = lambda s: ([j for p in POLICY_RETENTION for i in RETENTION_INITS             # each with the 25% run it takes its scores from
                       for j in (zero_shot_job(f'{p}:0.25', i if p == 'ga-s2' else INITS[0], 0), zero_shot_job(f'{p}:0.5', i, s))]
                      if 'policy-retention' in parts else [])
    later = range(1, seeds)
    todo = row('uniform:0.25', 0) + row('ar:0.25', 0) + gqa(0) + retention(0) + row('retrieval:0.25', 0)
    todo += [j for s in later for j in row('uniform:0.25', s)]
    todo += [recovery_job(i) for i in RECOVERY_INITS] if 'recovery' in parts else []
    ablation = lambda s: ([zero_shot_job(keep, f'taylor+ without {a}', s) for keep in ABLATION_POLICIES for a in ABLATED]
                          + [zero_shot_job(keep, f'taylor+ with {a}', s) for keep in ABLATION_POLICIES for a in ADDED] if 'ablation' in parts else [])
    todo += ablation(0)
    budget_runs = lambda s: ([zero_shot_job('uniform:0.25', i, s) for i in BUDGET_INITS]
                             + [zero_shot_job('retrieval:0.25', i, s) for i in BUDGET_RETRIEVAL] if 'budget' in parts else [])
    todo += budget_runs(0)
    mechanism = ([zero_shot_job('uniform:0.25', 'taylor+ without phase1', 0)]
                 + [zero_shot_job('uniform:0.25', f'{i} at gauge x{GAUGES[0]}', 0) for i in GAUGE_INITS]
                 + [zero_shot_job('uniform:0.25', f'{i} with steps={n}', 0) for n in MECHANISM_STEPS for i in MECHANISM_INITS]
                 + [zero_shot_job('uniform:0.25', f'{i} at gauge x{k}', 0) for k in GAUGES[1:] for i in GAUGE_INITS]
                 + [zero_shot_job('uniform:0.25', 'taylor+ without phase1', s) for s in later] if 'mechanism' in parts else [])
    todo += mechanism
    todo += half(0)
    todo += row('ga-s2:0.25', 0)
    todo += [j for s in later for j in row('ar:0.25', s) + row('retrieval:0.25', s) + row('ga-s2:0.25', s) + gqa(s) + retention(s) + half(s)]
    todo += [j for s in later for j in ablation(s) + budget_runs(s)]
    return list({job_key(j): j for j in todo}.values())        # shared cells once, first position kept

# ----- the ledger -----
def read_ledger(out_dir, setup_id, job_recipe_id=lambda job: recipe_id(job['init'])):
    """The ledger's rows of `setup_id` whose recipe is the one their job names now (`job_recipe_id`: the fingerprint of
    the recipe a job runs today), by key (the paper's Phase 1 under its new name)."""
    rows = [relabel(r) for r in read_jsonl(Path(out_dir)/'runs.jsonl')]
    def current(r):
        try: now = job_recipe_id(r['job'])
        except ValueError: return False                     # an init no recipe of today's has (an ablated switch taylor+ lacks)
        return r.get('recipe_id', LEGACY_IDS.get(r['job']['init'], now)) == now
    return {r['key']: r for r in rows if r['setup_id'] == setup_id and current(r)}

def relabel(row):
    "A row of the paper's Phase 1 alone written under its old name ('phase1', 'phase1 at gauge xK') as a row of 'taylor_phase1': the same recipe, renamed; its report stays under the old key (`report_key`)."
    from taylor_calibrate.core import Recipe
    old, new = RENAMED
    init = row.get('job', {}).get('init', '')
    if init != old and not init.startswith(old + ' at gauge x'): return row
    if row.get('recipe_id', LEGACY_IDS[old]) != fingerprint(Recipe(init, phase1=True)): return row
    job = {**row['job'], 'init': new + init[len(old):]}
    return {**row, 'job': job, 'key': job_key(job), 'recipe_id': recipe_id(job['init']), 'report_key': row['key']}

def read_jsonl(path: Path) -> list:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []

def append_jsonl(path: Path, row):
    "Append one row, on disk before this returns (a killed run loses no finished row)."
    with open(path, 'a') as f:
        f.write(json.dumps(row, default=float) + '\n'); f.flush(); os.fsync(f.fileno())

def append_ledger(out_dir, row): append_jsonl(Path(out_dir)/'runs.jsonl', row)

def report_name(key, recipe_id=None):
    "A run's report file name: its key's, and its recipe's fingerprint, so that a run of a name whose recipe changed keeps its report beside the older one's."
    return claim_name(key) + (f'-{recipe_id}' if recipe_id else '')

def report_path(out_dir, row) -> Path:
    "The report of a ledger row: the file of its key and recipe where there is one, else its key's (reports older than the fingerprinted names)."
    d, key = Path(out_dir)/'reports', row.get('report_key', row['key'])
    own = d/f"{report_name(key, row.get('recipe_id'))}.json.gz"
    return own if own.exists() else d/f'{report_name(key)}.json.gz'

def save_report(out_dir, key, report_json, recipe_id=None):
    "Keep a run's calibration report (per-layer rows, Phase-2 curves) beside the ledger, gzipped, named by the run's key and recipe."
    import gzip
    d = Path(out_dir)/'reports'; d.mkdir(exist_ok=True)
    with gzip.open(d/f'{report_name(key, recipe_id)}.json.gz', 'wt') as f: f.write(report_json)

def claim_name(key): return hashlib.sha1(key.encode()).hexdigest()

def _boot_id():
    try: return Path('/proc/sys/kernel/random/boot_id').read_text().strip()
    except OSError: return 'unknown'

def claim_is_live(path: Path) -> bool:
    """Whether the claim file at `path` still holds: its process (boot id and pid, written by `claim`) is running. An
    empty claim is being written if it is under a minute old; older, its writer died before writing its pid."""
    try: text, age = path.read_text(), time.time() - path.stat().st_mtime
    except OSError: return False
    if not text.strip(): return age < 60
    boot, pid = text.split()
    if boot != _boot_id(): return False
    try: os.kill(int(pid), 0); return True
    except ProcessLookupError: return False
    except PermissionError: return True

def claim(out_dir, key):
    "True if this process is the first to claim `key` (an exclusive file create holding its boot id and pid); a claim whose process is gone is taken over."
    path = Path(out_dir)/'.claims'/claim_name(key); path.parent.mkdir(exist_ok=True)
    for _ in range(2):
        try: fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if claim_is_live(path): return False
            path.unlink(missing_ok=True); continue
        with os.fdopen(fd, 'w') as f: f.write(f'{_boot_id()} {os.getpid()}')
        return True
    return False

# ----- running one job -----
def budget(a): return dict(steps=3, calib_tokens=1024, heldout_tokens=512) if a.mini else {}

def selection_source(job):
    """The run whose layer scores `job` reuses (None: it selects itself): AR and retrieval scores are init- and seed-free,
    GA-S2's depend on the init only, and no policy's depend on the kept fraction (the 25% run's scores rank the layers)."""
    if job['kind'] != 'zero_shot' or job['keep'].startswith('uniform'): return None
    policy = job['keep'].split(':')[0]
    src = dict(job, seed=0, kv_copy='heads', keep=f'{policy}:0.25', init=INITS[0] if policy in ('ar', 'retrieval') else job['init'])
    return None if src == job else src

def reused_layers(job, src_row, num_layers):
    "The layers `job` keeps, from the run it takes its layer choice from: the same choice, or its scores ranked for another fraction."
    if src_row['job']['keep'] == job['keep']: return src_row['kept']
    from taylor_calibrate.policies import kept_from_scores
    return kept_from_scores(job['keep'], src_row['selection']['scores'], num_layers)

SECOND_TEXT = ROOT/'LICENSE'     # the second evaluation text: the Apache License 2.0 (legal English, not Python documentation)

def second_text_ids(tok):
    "The second evaluation text's token ids, tokenised by the teacher's own tokenizer."
    return torch.tensor(tok(SECOND_TEXT.read_text(), add_special_tokens=False)['input_ids'])

def recipe_of(init):
    """The recipe an init names: one of the package's, or one of them with modifiers: 'taylor+ without <switch>', taylor+
    with one of `ABLATED` off (without minibatch, Phase 2 runs on taylor's budget too: 1,024 calibration tokens, full batch,
    no early stopping; without phase1, Phase 2 starts from the copy); 'taylor+ with <switch>', taylor+ with one of `ADDED`
    on; 'older taylor+', the recipe 'taylor+' named before Phase 1 by least squares (`OLDER_TAYLOR`); '<init> with rates xF', taylor+
    with both of Phase 2's learning rates times F; '<init> with steps=N', a recipe with
    Phase 2 capped at N steps; '<init> at gauge xK', the recipe run on the teacher rescaled to value/output gauge K (its
    W_V divided and its W_O multiplied by K: the same function, `run_zero_shot` rescales it)."""
    from dataclasses import replace
    from taylor_calibrate.core import get_recipe
    if ' at gauge x' in init:
        base, _, k = init.partition(' at gauge x')
        if not k.isdigit() or int(k) < 1: raise ValueError(f"unknown init {init!r}: a gauge is '<init> at gauge xK', K > 0")
        return replace(recipe_of(base), name=init)
    if ' with steps=' in init:
        base, _, n = init.partition(' with steps=')
        if not n.isdigit() or int(n) < 1 or not base.startswith(('taylor', 'phase2', 'older taylor+')) or not recipe_of(base).phase2:
            raise ValueError(f"unknown init {init!r}: a step cap is '<init with Phase 2> with steps=N', N > 0")
        return replace(recipe_of(base), name=init, steps=int(n))
    if ' with rates x' in init:
        base, _, f = init.partition(' with rates x')
        if base != 'taylor+' or not f.isdigit() or int(f) < 1: raise ValueError(f"unknown init {init!r}: a rate factor is 'taylor+ with rates xF', F > 0")
        r = get_recipe(base)
        return replace(r, name=init, lr_qkv=r.lr_qkv * int(f), lr_gates=r.lr_gates * int(f))
    if init == 'older taylor+': return replace(get_recipe('taylor+'), name=init, **OLDER_TAYLOR)
    base, _, switch = init.partition(' with ')
    if switch:
        if base != 'taylor+' or switch not in ADDED: raise ValueError(f'unknown init {init!r}: additions are taylor+ with one of {ADDED}')
        return replace(get_recipe(base), name=init, **{switch: True})
    base, _, switch = init.partition(' without ')
    if not switch: return get_recipe(init)
    if base != 'taylor+' or switch not in ABLATED: raise ValueError(f'unknown init {init!r}: ablations are taylor+ without one of {ABLATED}')
    off = dict(calib_tokens=get_recipe('taylor').calib_tokens, heldout_tokens=get_recipe('taylor').heldout_tokens, batch_windows=0, patience=0)
    return replace(get_recipe(base), name=init, **{switch: False}, **(off if switch == 'minibatch' else {}))

def gauge_of(init) -> int | None:
    "The value/output gauge K an init's teacher is rescaled to ('<init> at gauge xK'), or None."
    return int(init.partition(' at gauge x')[2]) if ' at gauge x' in init else None

def fingerprint(recipe):
    "A recipe's fields as a short hash (fields younger than the ledgers left out at their default)."
    from dataclasses import asdict
    fields = {k: v for k, v in asdict(recipe).items() if not (k in LATER_FIELDS and v == LATER_FIELDS[k])}
    return hashlib.sha1(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]

def recipe_id(init):
    "A fingerprint of an init's recipe: a ledger row made with another recipe of the same name is run again."
    return fingerprint(recipe_of(init))

def run_zero_shot(job, teacher, tok, test_ids, valid_ids, a, kept=None):
    from taylor_calibrate.core import calibrate
    from taylor_calibrate.teacher import perplexity
    ckpt = Path(a.checkpoints)/claim_name(job_key(job))/'calibrate' if a.checkpoints else None   # a killed run resumes layer by layer
    if (k := gauge_of(job['init'])) is not None:        # the same function at another value/output gauge
        from taylor_calibrate.core import rescale_value_output
        teacher = rescale_value_output(teacher, k)
    student = calibrate(teacher, 'train', keep=kept or job['keep'], init=recipe_of(job['init']), tokenizer=tok, seed=job['seed'], progress=False,
                        selection_data=valid_ids[:a.selection_tokens], gdn_options=dict(kv_copy=job['kv_copy']), mixer=a.mixer,
                        checkpoint_dir=ckpt, **budget(a))
    rep = student.calibration_report
    if a.save_students:            # kept for the long-context probes (scripts/long_context.py), named by the run's key
        from taylor_calibrate.convert import save_hybrid
        save_hybrid(student, Path(a.save_students)/claim_name(job_key(job)), tok, overwrite=True)
    return dict(ppl=perplexity(student, test_ids, progress=False), valid_ppl=perplexity(student, valid_ids, progress=False),
                second_text_ppl=perplexity(student, second_text_ids(tok), progress=False),
                kept=rep.keep, selection=rep.selection, timings=rep.timings, report=rep.to_json())

def recovery_windows(tok, a):
    "Distillation windows from TRAIN, after the first 64 windows (those calibration reads)."
    from taylor_calibrate.core import token_windows
    return token_windows('train', tok, a.seq_len, max_tokens=a.recovery_tokens + 64 * a.seq_len)[64:]

def run_recovery(job, teacher, tok, valid_ids, a):
    """Calibrate, then distil on TRAIN. With --checkpoints, a killed run resumes: the calibrated student is saved before
    distillation starts and distillation checkpoints about every tenth of its budget (`distill` resumes them exactly)."""
    from taylor_calibrate.core import calibrate
    from taylor_calibrate.distill import distill
    from taylor_calibrate.hybrid import save_hybrid, load_hybrid
    ckpt = Path(a.checkpoints)/claim_name(job_key(job)) if a.checkpoints else None
    if ckpt is not None and (ckpt/'calibrated').is_dir():        # written atomically: present means complete
        student = load_hybrid(ckpt/'calibrated')
    else:
        student = calibrate(teacher, 'train', keep=job['keep'], init=recipe_of(job['init']), tokenizer=tok, seed=job['seed'], progress=False,
                            mixer=a.mixer, checkpoint_dir=None if ckpt is None else ckpt/'calibrate', **budget(a))
        if ckpt is not None: save_hybrid(student, ckpt/'calibrated', tok)
    micro = a.micro_batch or a.batch_size           # windows per forward; a step still takes --batch-size windows
    log = distill(student, teacher, recovery_windows(tok, a), tokens=a.recovery_tokens, seq_len=a.seq_len, batch_size=micro,
                  grad_accum=a.batch_size // micro, eval_data=valid_ids, eval_tokens=valid_ids.numel(), progress=False,
                  checkpoint_dir=None if ckpt is None else ckpt/'distill')
    if a.save_students:            # the recovered student, for the long-context probes
        save_hybrid(student, Path(a.save_students)/claim_name(job_key(job)), tok, overwrite=True)
    return dict(log=json.loads(log.to_json()), distill_s=log.wall_time[-1] if log.wall_time else 0., micro_batch=micro)

def backfill_valid(a):
    "Append, for each zero-shot run of the ledger without a VALID perplexity whose student --save-students holds, the same row with it."
    from taylor_calibrate.hybrid import load_hybrid
    from taylor_calibrate.teacher import perplexity
    teacher, tok, test_ids, valid_ids = load(a)
    _, sid = setup_of(a, test_ids, valid_ids)
    for key, row in read_ledger(a.out_dir, sid).items():
        student = Path(a.save_students)/claim_name(key)
        if row['job']['kind'] != 'zero_shot' or 'valid_ppl' in row or not student.is_dir(): continue
        row = dict(row, valid_ppl=perplexity(load_hybrid(student), valid_ids, progress=False))
        append_ledger(a.out_dir, row)
        print(f"{row['job']['keep']:13} {row['job']['init']:9} seed {row['job']['seed']}: valid ppl {row['valid_ppl']:.2f}", flush=True)

def read_reproduced(out_dir, setup_id):
    "The runs `--reproduce` ran again, by key: the ledger's TEST perplexity beside the new one."
    return {r['key']: r for r in read_jsonl(Path(out_dir)/'reproduced.jsonl') if r['setup_id'] == setup_id}

def reproduce(a):
    """Run again, from scratch, each zero-shot run of the ledger whose key matches the regular expression --reproduce, on
    the layers its row kept (a policy's selection is not measured again), and append its key, the ledger's TEST perplexity
    and the new one to `<out-dir>/reproduced.jsonl`; a run already there is not run again. With --save-students the new
    student is saved under the run's name, as a run of the grid's would be."""
    import re
    teacher, tok, test_ids, valid_ids = load(a)
    _, sid = setup_of(a, test_ids, valid_ids)
    done = read_reproduced(a.out_dir, sid)
    for key, row in read_ledger(a.out_dir, sid).items():
        if row['job']['kind'] != 'zero_shot' or not re.search(a.reproduce, key) or key in done: continue
        if not claim(a.out_dir, 'reproduce|' + key): continue
        t0, job = time.time(), row['job']
        a_ckpt = argparse.Namespace(**{**vars(a), 'checkpoints': a.checkpoints and str(Path(a.checkpoints)/'reproduce')})
        res = run_zero_shot(job, teacher, tok, test_ids, valid_ids, a_ckpt, kept=row['kept'])
        if a.checkpoints: shutil.rmtree(Path(a_ckpt.checkpoints)/claim_name(key), ignore_errors=True)
        new = dict(key=key, setup_id=sid, recipe_id=recipe_id(job['init']), job=job, ledger_ppl=row['ppl'], ppl=res['ppl'],
                   ledger_valid_ppl=row.get('valid_ppl'), valid_ppl=res['valid_ppl'], kept=row['kept'], seconds=time.time() - t0)
        append_jsonl(Path(a.out_dir)/'reproduced.jsonl', new)
        print(f"reproduced {job['keep']:13} {job['init']:9} seed {job['seed']}: ppl {row['ppl']:.2f} in the ledger, {res['ppl']:.2f} again "
              f"({res['ppl'] / row['ppl'] - 1:+.2%}, {time.time() - t0:.0f}s)", flush=True)

def setup_of(a, test_ids, valid_ids):
    teacher = {} if a.teacher is None else dict(teacher=a.teacher)     # the default teacher's ledger has no such key
    mixer = {} if a.mixer == 'gdn' else dict(mixer=a.mixer)            # nor have GDN ledgers a mixer key
    s = dict(**teacher, **mixer, eval_split='test', eval_tokens=test_ids.numel(), selection_split='valid', calib_split='train', valid_tokens=valid_ids.numel(),
             mini=a.mini, budget=budget(a), recovery_tokens=a.recovery_tokens, seq_len=a.seq_len, batch_size=a.batch_size,
             torch=torch.__version__)
    return s, hashlib.sha1(json.dumps(s, sort_keys=True).encode()).hexdigest()[:12]

def load(a):
    from taylor_calibrate.teacher import load_teacher, corpus_token_ids
    teacher, tok = load_teacher(a.teacher)
    return teacher, tok, corpus_token_ids(tok, 'test', a.eval_tokens), corpus_token_ids(tok, 'valid', a.valid_tokens)

def work(a):
    """Take unclaimed, unfinished runs from the list until none is left; a run that reuses another's layer choice waits for
    it, unless --inits or --policies leave that run out and no other process has it (then it is skipped, and said so)."""
    teacher, tok, test_ids, valid_ids = load(a)
    setup, sid = setup_of(a, test_ids, valid_ids)
    todo = [j for j in jobs(a.parts.split(','), a.seeds, a.mini) if (a.inits is None or j['init'] in a.inits.split(','))
            and (a.policies is None or j['keep'].split(':')[0] in a.policies.split(','))]
    listed, skipped = {job_key(j) for j in todo}, set()
    while True:
        ledger, waiting, ran = read_ledger(a.out_dir, sid), False, False
        for job in todo:
            key = job_key(job)
            if key in ledger or claim_is_live(Path(a.out_dir)/'.claims'/claim_name(key)): continue
            src = selection_source(job)
            if src is not None and job_key(src) not in ledger:
                if job_key(src) in listed or claim_is_live(Path(a.out_dir)/'.claims'/claim_name(job_key(src))): waiting = True
                elif key not in skipped:
                    skipped.add(key); print(f"[worker {a.worker}] skipped {key}: it takes its layers from {job_key(src)}, "
                                            "which is neither in the ledger nor in this run's list", flush=True)
                continue
            if not claim(a.out_dir, key): continue
            t0 = time.time()
            kept = reused_layers(job, ledger[job_key(src)], teacher.config.num_hidden_layers) if src is not None else None
            res = (run_zero_shot(job, teacher, tok, test_ids, valid_ids, a, kept) if job['kind'] == 'zero_shot'
                   else run_recovery(job, teacher, tok, valid_ids, a))
            if 'report' in res: save_report(a.out_dir, key, res.pop('report'), recipe_id(job['init']))
            seconds = time.time() - t0 + res.get('timings', {}).get('resumed_s', 0.)    # counting what a killed earlier leg calibrated
            append_ledger(a.out_dir, dict(key=key, setup_id=sid, recipe_id=recipe_id(job['init']), job=job, seconds=seconds, **res))
            if a.checkpoints and job['kind'] == 'zero_shot':     # its row holds the result: the layers it saved are not needed again
                shutil.rmtree(Path(a.checkpoints)/claim_name(key), ignore_errors=True)
            what = f"ppl {res['ppl']:9.2f}" if 'ppl' in res else f"valid ppl {res['log']['eval_ppl'][0]:.2f} -> {res['log']['eval_ppl'][-1]:.2f}"
            print(f"[worker {a.worker}] {job['kind']:9} {job['keep']:13} {job['init']:9} seed {job['seed']} {job.get('kv_copy', ''):8} "
                  f"{what} ({time.time() - t0:.0f}s)", flush=True)
            ran = True; break                     # re-read the ledger: runs waiting on this one may be free now
        if not ran:
            if not waiting: return
            time.sleep(5)

# ----- the summary the notebook reads -----
def _summ(xs): return dict(values=xs, mean=statistics.mean(xs), std=statistics.pstdev(xs), n=len(xs))

def run_seconds(row):
    """A ledger row's seconds as if its run had not been killed and resumed. Rows written before calibrate's timings counted
    the layers a resumed call loaded (no `resumed_s`) hold the last leg only; their report's Phase-1 and Phase-2 seconds,
    which do count the loaded layers, exceed its `total_s` by what the earlier legs calibrated."""
    t = row.get('timings') or {}
    if 'total_s' not in t or 'resumed_s' in t: return row['seconds']
    return row['seconds'] + max(0., sum(v for k, v in t.items() if k != 'total_s') - t['total_s'])

def summarise(ledger, setup, teacher_test_ppl, teacher_valid_ppl, teacher_second_text_ppl=None):
    "Group the ledger's runs into the grid, retention, GQA, ablation and recovery tables (mean and spread over seeds)."
    from taylor_calibrate.distill import DistillLog, tokens_to_reach
    zs = {}
    for r in ledger.values():
        j = r['job']
        if j['kind'] == 'zero_shot': zs.setdefault((j['keep'], j['init'], j['kv_copy']), []).append((j['seed'], r))
    def cell(keep, init, kv='heads'):
        rs = sorted(zs.get((keep, init, kv), []), key=lambda t: t[0])
        if not rs: return None
        second = [r['second_text_ppl'] for _, r in rs if 'second_text_ppl' in r]
        valid = [r['valid_ppl'] for _, r in rs if 'valid_ppl' in r]
        return dict(**_summ([r['ppl'] for _, r in rs]), seeds=[s for s, _ in rs], kept=[r['kept'] for _, r in rs],
                    seconds=statistics.median([run_seconds(r) for _, r in rs]), **(dict(second_text=_summ(second)) if second else {}),
                    **(dict(valid=_summ(valid)) if valid else {}))
    drop_empty = lambda d: {k: v for k, v in d.items() if v is not None}
    out = dict(setup=setup, teacher_test_ppl=teacher_test_ppl, teacher_valid_ppl=teacher_valid_ppl,
               **(dict(teacher_second_text_ppl=teacher_second_text_ppl, second_text=SECOND_TEXT.name) if teacher_second_text_ppl else {}),
               grid=drop_empty({f'{p}|{i}': cell(p, i) for p in POLICIES for i in INITS}),
               retention=drop_empty({f'{p}:{f}|{i}': cell(f'{p}:{f}', i) for p in ('uniform', *POLICY_RETENTION) for f in RETENTION
                                     for i in RETENTION_INITS if p == 'uniform' or f == 0.5}),
               gqa=drop_empty({kv: cell('uniform:0.25', 'taylor', kv) for kv in ('heads', 'rows_bug')}),
               ablation=drop_empty({i: cell('uniform:0.25', i) for i in ('taylor+', *(f'taylor+ without {s}' for s in ABLATED),
                                                                       *(f'taylor+ with {s}' for s in ADDED))}),
               budget=drop_empty({i: cell('uniform:0.25', i) for i in ('taylor+', *BUDGET_INITS)}),
               retrieval_variants=drop_empty({i: cell('retrieval:0.25', i) for i in ('taylor+', *BUDGET_RETRIEVAL, *(f'taylor+ without {s}' for s in ABLATED),
                                                                                   *(f'taylor+ with {s}' for s in ADDED))}),
               mechanism=drop_empty({i: cell('uniform:0.25', i) for i in (
                   *(f'{i} with steps={n}' for n in MECHANISM_STEPS for i in MECHANISM_INITS), *MECHANISM_INITS,
                   *GAUGE_INITS, *(f'{i} at gauge x{k}' for k in GAUGES for i in GAUGE_INITS))}))
    logs = {r['job']['init']: r['log'] for r in ledger.values() if r['job']['kind'] == 'recovery'}
    if logs:
        targets = {f'{m}x teacher': m * teacher_valid_ppl for m in TARGETS}
        if 'naive' in logs: targets['naive final'] = logs['naive']['eval_ppl'][-1]
        reach = {i: {t: tokens_to_reach(DistillLog.from_json(json.dumps(j)), v) for t, v in targets.items()} for i, j in logs.items()}
        ratios = {}
        for init in ('taylor', 'taylor+'):
            if 'naive' not in reach or init not in reach: continue
            ratios[init] = {t: _ratio(reach['naive'][t], reach[init][t], logs['naive']['eval_tokens'][-1]) for t in targets}
        out['recovery'] = dict(logs=logs, targets=targets, tokens_to_reach=reach, naive_over=ratios)
    return out

def _ratio(naive, calibrated, budget):
    """naive tokens / calibrated tokens to one target. 'inf' when the calibrated run starts at the target; a lower bound
    (budget / calibrated tokens) when naive never gets there within `budget`; None when the calibrated run never does."""
    if calibrated is None: return None
    if calibrated[0] == 0:
        return dict(ratio=float('inf'), naive_tokens=None if naive is None else naive[0], calibrated_tokens=0)
    if naive is None: return dict(ratio=budget / calibrated[0], lower_bound=True, naive_tokens=None, calibrated_tokens=calibrated[0])
    return dict(ratio=naive[0] / calibrated[0], lower_bound=False, naive_tokens=naive[0], calibrated_tokens=calibrated[0],
                naive_upper_bound=naive[1], calibrated_upper_bound=calibrated[1])

def run_workers(a, work, script):
    """Run the unfinished runs: in this process (`a.worker` set, or one worker) or in `a.workers` processes of `script`
    that share the run list through claim files (a claim whose process is gone, as an interrupted run leaves it, is
    taken over; a live one, another invocation's worker included, is left to it). True if this is a worker."""
    out_dir = Path(a.out_dir); out_dir.mkdir(parents=True, exist_ok=True)
    if a.worker is not None: work(a); return True
    if a.summarise_only: return False            # a summary runs nothing
    if a.workers == 1: a.worker = 0; work(a)
    else:
        procs = [subprocess.Popen([sys.executable, script, *sys.argv[1:], '--worker', str(w), '--threads', str(max(1, a.threads // a.workers))])
                 for w in range(a.workers)]
        if any(p.wait() for p in procs): raise SystemExit('a worker failed; finished runs are in the ledger, rerun to resume')
    return False

def main(a):
    torch.set_num_threads(a.threads); torch.set_flush_denormal(True)
    if a.backfill_valid: backfill_valid(a)
    elif a.reproduce: reproduce(a)
    elif run_workers(a, work, __file__): return
    out_dir = Path(a.out_dir)
    from taylor_calibrate.teacher import perplexity
    teacher, tok, test_ids, valid_ids = load(a)
    setup, sid = setup_of(a, test_ids, valid_ids)
    ledger = read_ledger(out_dir, sid)
    if not ledger and (out_dir/'runs.jsonl').exists() and (out_dir/'runs.jsonl').read_text().strip():
        raise SystemExit(f"{out_dir/'runs.jsonl'} holds runs, none of setup {sid}: summarise with the options they ran with "
                         "(--teacher, --eval-tokens, --mixer, ...); experiments.json is left as it was")
    missing = [job_key(j) for j in jobs(a.parts.split(','), a.seeds, a.mini) if job_key(j) not in ledger]
    res = summarise(ledger, dict(setup, seeds=a.seeds, parts=a.parts, selection_tokens=a.selection_tokens, runs_done=len(ledger),
                                 runs_missing=missing),
                    perplexity(teacher, test_ids, progress=False), perplexity(teacher, valid_ids, progress=False),
                    perplexity(teacher, second_text_ids(tok), progress=False))
    again = [r for r in read_reproduced(out_dir, sid).values() if r['key'] in ledger]
    if again: res['reproduced'] = [{k: r[k] for k in ('job', 'ledger_ppl', 'ppl', 'ledger_valid_ppl', 'valid_ppl', 'seconds')} for r in again]
    (out_dir/'experiments.json').write_text(json.dumps(res, indent=1, default=float)); print('wrote', out_dir/'experiments.json')
    return res

if __name__ == '__main__':
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--mini', action='store_true', help='tiny budgets everywhere: checks the code path, measures nothing')
    p.add_argument('--parts', default='grid,retention,gqa,recovery')
    p.add_argument('--seeds', type=int, default=3)
    p.add_argument('--eval-tokens', type=int, default=None, help='test tokens per evaluation (default: the whole test split)')
    p.add_argument('--valid-tokens', type=int, default=16384)
    p.add_argument('--selection-tokens', type=int, default=16384, help='VALID tokens the AR and GA-S2 layer scores are measured on')
    p.add_argument('--recovery-tokens', type=int, default=262144)
    p.add_argument('--seq-len', type=int, default=512)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument('--micro-batch', type=int, default=None, help='recovery: windows per forward pass, the step taking --batch-size '
                   'windows by gradient accumulation (less memory, the same run; default: --batch-size)')
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--workers', type=int, default=1, help='processes sharing the run list (each gets threads // workers threads)')
    p.add_argument('--worker', type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument('--summarise-only', action='store_true', help='run nothing: summarise the runs already in the ledger (e.g. after stopping early)')
    p.add_argument('--teacher', default=None, help='a teacher name load_teacher takes: tiny-qwen2 (default), tiny-qwen3, smollm2-135m')
    p.add_argument('--checkpoints', default=None, help='keep each run\'s calibrated layers (and, for recovery, its calibrated student and '
                   'distillation checkpoints) in this folder, one subfolder per run, so that a killed run resumes where it stopped')
    p.add_argument('--save-students', default=None, help='save each student (zero-shot, and recovered after distillation) in this folder, one subfolder per run')
    p.add_argument('--backfill-valid', action='store_true', help='run nothing new: add the VALID perplexity to the ledger\'s zero-shot '
                   'runs that lack it, from the students --save-students holds, then summarise')
    p.add_argument('--reproduce', default=None, metavar='REGEX', help='run nothing new: run again each zero-shot run of the ledger whose key '
                   "matches REGEX (e.g. 'init=taylor\\+\\|keep=uniform:0.5'), on the layers it kept, and record both TEST perplexities in "
                   'reproduced.jsonl, then summarise')
    p.add_argument('--inits', default=None, help='run only these inits (comma list; default: all); the summary still reads every run in the ledger')
    p.add_argument('--policies', default=None, help='run only these layer policies (comma list of uniform, ar, ga-s2, retrieval; default: all)')
    p.add_argument('--mixer', default='gdn', choices=('gdn', 'kda', 'mamba2'), help="the converted layers' mixer (default gdn)")
    p.add_argument('--out-dir', default=None, help='default: bench/results/experiments/ (default teacher) or bench/results/experiments_<teacher>/, '
                   'with _<mixer> appended for a mixer other than gdn')
    a = p.parse_args()
    if a.teacher == 'tiny-qwen2': a.teacher = None                      # the default teacher, named: the same ledger and setup
    if a.out_dir is None:
        name = '_'.join(['experiments', *([] if a.teacher is None else [a.teacher]), *([] if a.mixer == 'gdn' else [a.mixer])])
        a.out_dir = str(ROOT/'bench'/'results'/name)
    if a.mini: a.seeds, a.eval_tokens, a.valid_tokens, a.recovery_tokens, a.seq_len, a.batch_size, a.selection_tokens = 1, 2048, 1024, 1024, 256, 2, 1024
    if a.backfill_valid and not a.save_students: p.error('--backfill-valid reads the students of --save-students: name that folder')
    if a.micro_batch is not None and (a.micro_batch < 1 or a.batch_size % a.micro_batch):
        p.error(f'--micro-batch must divide --batch-size ({a.batch_size}), got {a.micro_batch}')
    main(a)
