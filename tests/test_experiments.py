"A miniature run of scripts/experiments.py (every part, a few steps each, two workers) keeps the experiment code path tested."
import json, os, subprocess, sys
from conftest import ROOT

def run(out, *extra):
    return subprocess.run([sys.executable, str(ROOT/'scripts'/'experiments.py'), '--mini', '--threads', '2', '--out-dir', str(out), *extra],
                          capture_output=True, text=True)

def test_experiments_mini(tmp_path):
    ckpt = str(tmp_path/'checkpoints')
    r = run(tmp_path, '--workers', '2', '--micro-batch', '1', '--checkpoints', ckpt)   # recovery steps of 2 windows as 2 micro-batches of 1
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path/'experiments.json').read_text())
    assert {'grid', 'retention', 'gqa', 'recovery'} <= set(res)
    assert res['setup']['runs_missing'] == [] and res['setup']['runs_done'] == 14 + 1 + 6 + 4
    assert len(res['grid']) == 14 and all(v['mean'] > 1 and v['n'] == 1 for v in res['grid'].values())
    assert res['retention']['uniform:0.25|taylor'] == res['grid']['uniform:0.25|taylor']     # a shared cell, computed once
    assert set(res['gqa']) == {'heads', 'rows_bug'}
    kept = {tuple(map(tuple, v['kept'])) for k, v in res['grid'].items() if k.startswith('ar:')}
    assert len(kept) == 1, 'every AR run reuses the one AR layer choice'
    assert set(res['recovery']['logs']) == {'naive', 'zero_gate', 'taylor', 'taylor+'}
    assert all(v['second_text']['n'] == 1 for v in res['grid'].values()) and res['teacher_second_text_ppl'] > 1
    assert len(list((tmp_path/'reports').glob('*.json.gz'))) == 14 + 1 + 6      # each zero-shot run's calibration report
    rows = (tmp_path/'runs.jsonl').read_text().splitlines()
    keys = [json.loads(l)['key'] for l in rows]
    assert len(keys) == len(set(keys)) == 14 + 1 + 6 + 4        # grid, gqa rows_bug, retention 50%/75%, recovery: each run once
    assert all(json.loads(l)['micro_batch'] == 1 for l in rows if '"recovery"' in l)
    assert all(json.loads(l)['valid_ppl'] > 1 for l in rows if '"zero_shot"' in l)     # the split a recipe is chosen on
    # a second invocation finds every run in the ledger and only re-summarises
    r = run(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path/'runs.jsonl').read_text().splitlines() == rows
    # recovery runs killed after their last checkpoint: rerun, they load the calibrated student and resume the distillation
    # (the restored log keeps the first run's wall time, which a fresh run would not reproduce)
    runs = [d for d in (tmp_path/'checkpoints').iterdir()]
    assert len(runs) == 4 and all((d/'calibrated'/'config.json').exists() and (d/'distill'/'ckpt').is_dir() for d in runs)
    assert all((d/'calibrate'/'calibrate.json').exists() for d in runs)   # the calibrated layers too; a zero-shot run's go with its ledger row
    recovery = {json.loads(l)['key']: json.loads(l) for l in rows if '"recovery"' in l}
    (tmp_path/'runs.jsonl').write_text(''.join(l + '\n' for l in rows if '"recovery"' not in l))
    r = run(tmp_path, '--checkpoints', ckpt, '--micro-batch', '1')
    assert r.returncode == 0, r.stderr[-3000:]
    again = {json.loads(l)['key']: json.loads(l) for l in (tmp_path/'runs.jsonl').read_text().splitlines() if '"recovery"' in l}
    assert again.keys() == recovery.keys()
    for k, row in again.items():
        assert row['log'] == recovery[k]['log'] and row['distill_s'] == recovery[k]['distill_s'], k

def test_the_ablation_turns_off_one_switch_of_taylor_plus_at_a_time():
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    from dataclasses import asdict
    from taylor_calibrate.core import get_recipe
    full = asdict(get_recipe('taylor+'))
    for s in e.ABLATED:
        assert full[s] is True, s                                             # each ablated switch is on in taylor+
        diff = {k for k, v in asdict(e.recipe_of(f'taylor+ without {s}')).items() if v != full[k]}
        budget = {'calib_tokens', 'heldout_tokens', 'batch_windows', 'patience'} if s == 'minibatch' else set()
        assert diff == {'name', s} | budget, (s, diff)
    assert e.recipe_of('taylor') is get_recipe('taylor') and e.recipe_id('taylor+') != e.recipe_id('taylor+ without fit')
    for bad in ('taylor without gauge_fix', 'taylor+ without steps'):
        try: e.recipe_of(bad); raise AssertionError(bad)
        except ValueError as x: assert 'unknown init' in str(x)
    ablated = ([(p, f'taylor+ without {s}') for p in e.ABLATION_POLICIES for s in e.ABLATED]
               + [(p, f'taylor+ with {s}') for p in e.ABLATION_POLICIES for s in e.ADDED])
    assert e.ABLATION_POLICIES == ('uniform:0.25', 'retrieval:0.25')
    assert [(j['keep'], j['init']) for j in e.jobs(['ablation'], 1)] == ablated
    assert [(j['keep'], j['init'], j['seed']) for j in e.jobs(['ablation'], 3)] == [(*a, s) for s in range(3) for a in ablated]   # seed 0 of each switch first
    assert [(j['keep'], j['init']) for j in e.jobs(['grid', 'ablation'], 2)][-len(ablated):] == ablated                    # later seeds after everything else

def test_an_addition_turns_on_one_switch_of_taylor_plus_and_old_fingerprints_hold():
    "'taylor+ with constant_gate' differs from taylor+ in that switch alone; a recipe field at its default is left out of the fingerprint, so ledger rows written before the field existed stay current."
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e, hashlib, json
    from dataclasses import asdict
    from taylor_calibrate.core import get_recipe
    full = asdict(get_recipe('taylor+'))
    for s in e.ADDED:
        assert full[s] is False, s
        assert {k for k, v in asdict(e.recipe_of(f'taylor+ with {s}')).items() if v != full[k]} == {'name', s}
        assert e.recipe_id(f'taylor+ with {s}') != e.recipe_id('taylor+')
    paper = asdict(get_recipe('taylor'))                                          # every later field at its default ...
    before = {k: v for k, v in paper.items() if k not in e.LATER_FIELDS}          # ... so taylor as the ledgers' rows recorded it
    assert e.recipe_id('taylor') == hashlib.sha1(json.dumps(before, sort_keys=True, default=str).encode()).hexdigest()[:12]
    for bad in ('taylor with gauge_fix', 'taylor+ with fit'):
        try: e.recipe_of(bad); raise AssertionError(bad)
        except ValueError as x: assert 'unknown init' in str(x)

def test_rows_of_the_papers_phase1_under_its_old_name_are_read_under_its_new_one(tmp_path):
    "A row of init 'phase1' written when that name meant the paper's Phase 1 alone (with its fingerprint, or before fingerprints) is a 'taylor_phase1' row; a row of Phase 1 by least squares stays 'phase1'."
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    old = lambda init, **kw: {**dict(key=e.job_key(e.zero_shot_job('uniform:0.25', init, 0)), setup_id='s', job=e.zero_shot_job('uniform:0.25', init, 0), ppl=1.), **kw}
    rows = [old('phase1', recipe_id=e.LEGACY_IDS['phase1']), old('phase1 at gauge x10', recipe_id='9c49f40849f3'),
            {**old('phase1'), 'key': 'before fingerprints', 'job': {**e.zero_shot_job('uniform:0.25', 'phase1', 1)}},
            old('phase1', recipe_id=e.recipe_id('phase1'), ppl=2.), old('taylor+', ppl=3.)]
    for r in rows: e.append_ledger(tmp_path, r)
    got = {(r['job']['init'], r['job']['seed']): r['ppl'] for r in e.read_ledger(tmp_path, 's').values()}
    assert got == {('taylor_phase1', 0): 1., ('taylor_phase1 at gauge x10', 0): 1., ('taylor_phase1', 1): 1., ('phase1', 0): 2.}, got
    from taylor_calibrate.core import Recipe
    assert e.fingerprint(Recipe('phase1 at gauge x10', phase1=True)) == '9c49f40849f3'

def test_a_step_cap_is_taylor_plus_with_only_its_steps_changed():
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    from dataclasses import asdict
    from taylor_calibrate.core import get_recipe
    full, capped = asdict(get_recipe('taylor+')), asdict(e.recipe_of('taylor+ with steps=1000'))
    assert {k for k, v in capped.items() if v != full[k]} == {'name', 'steps'} and capped['steps'] == 1000
    variants = ([('uniform:0.25', f'taylor+ with steps={n}') for n in e.STEP_CAPS] + [('uniform:0.25', f'taylor+ with rates x{f}') for f in e.RATE_FACTORS]
                + [('retrieval:0.25', f'taylor+ with steps={e.STEP_CAPS[0]}'), ('retrieval:0.25', 'older taylor+ with steps=100')])
    assert [(j['keep'], j['init'], j['seed']) for j in e.jobs(['budget'], 3)] == [(*v, s) for s in range(3) for v in variants]
    assert [(j['keep'], j['init'], j['seed']) for j in e.jobs(['budget'], 1)] == [(*v, 0) for v in variants]
    assert e.recipe_id('taylor+ with steps=1000') != e.recipe_id('taylor+')
    assert asdict(e.recipe_of('taylor with steps=30'))['steps'] == 30 and e.recipe_of('taylor with steps=30').phase1
    for bad in ('phase1 with steps=10', 'naive with steps=10', 'taylor+ with steps=0', 'taylor+ with steps=many'):
        try: e.recipe_of(bad); raise AssertionError(bad)
        except ValueError as x: assert 'unknown init' in str(x)

def test_older_taylor_plus_is_the_recipe_the_ledgers_older_rows_ran():
    "'older taylor+' under the name 'taylor+' has the fingerprint of the ledgers' rows written before Phase 1 by least squares."
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    from dataclasses import replace
    older = e.recipe_of('older taylor+')
    assert e.fingerprint(replace(older, name='taylor+')) == e.LEGACY_IDS['taylor+'] and not older.fit and older.gauge_fix and older.steps == 300
    assert e.recipe_of('older taylor+ with steps=100').steps == 100 and e.recipe_id('older taylor+ with steps=100') != e.recipe_id('taylor+')

def test_a_gauge_run_is_its_recipe_on_a_rescaled_teacher():
    "'<init> at gauge xK' is the init's recipe under its own name (a fingerprint of its own), run on the teacher rescaled by K."
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    from dataclasses import asdict
    from taylor_calibrate.core import get_recipe
    r = asdict(e.recipe_of('phase2 at gauge x10'))
    assert {k for k, v in r.items() if v != asdict(get_recipe('phase2'))[k]} == {'name'} and e.gauge_of('phase2 at gauge x10') == 10
    assert e.gauge_of('phase2') is None and e.recipe_id('phase2 at gauge x10') != e.recipe_id('phase2')
    assert e.recipe_of('taylor+ without phase1 with steps=30').steps == 30 and not e.recipe_of('taylor+ without phase1').phase1
    for bad in ('phase2 at gauge x0', 'phase2 at gauge xbig', 'nothing at gauge x10'):
        try: e.recipe_of(bad); raise AssertionError(bad)
        except ValueError as x: assert 'unknown init' in str(x)
    inits = [j['init'] for j in e.jobs(['mechanism'], 3)]
    assert inits[0] == 'taylor+ without phase1' and inits.count('taylor+ without phase1') == 3 and 'taylor at gauge x100' in inits

def test_a_rate_factor_is_taylor_plus_with_only_its_two_rates_changed():
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    from dataclasses import asdict
    from taylor_calibrate.core import get_recipe
    full, fast = asdict(get_recipe('taylor+')), asdict(e.recipe_of('taylor+ with rates x4'))
    assert {k for k, v in fast.items() if v != full[k]} == {'name', 'lr_qkv', 'lr_gates'}
    assert (fast['lr_qkv'], fast['lr_gates']) == (4 * full['lr_qkv'], 4 * full['lr_gates'])
    assert e.recipe_id('taylor+ with rates x4') != e.recipe_id('taylor+')
    for bad in ('taylor with rates x4', 'taylor+ with rates x0', 'taylor+ with rates xfast'):
        try: e.recipe_of(bad); raise AssertionError(bad)
        except ValueError as x: assert 'unknown init' in str(x)

def test_a_resumed_runs_seconds_count_the_layers_its_earlier_legs_calibrated():
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    whole = dict(seconds=2068., timings=dict(select_s=0., convert_s=1., statistics_s=11., phase1_s=2., phase2_s=1897., total_s=1919.))
    assert e.run_seconds(whole) == 2068.                                   # not resumed: the row as written
    old = dict(seconds=271., timings=dict(select_s=0., convert_s=0., statistics_s=7., phase1_s=2., phase2_s=1736., total_s=141.))
    assert e.run_seconds(old) == 271. + (7 + 2 + 1736) - 141              # resumed before calibrate counted loaded layers
    new = dict(seconds=1900., timings=dict(select_s=0., convert_s=0., statistics_s=7., phase1_s=2., phase2_s=1736., total_s=1760.,
                                           resumed_s=1620.))
    assert e.run_seconds(new) == 1900.                                     # calibrate and the ledger count them already
    assert e.run_seconds(dict(seconds=5.)) == 5.                           # recovery rows have no timings

def test_a_summary_leaves_running_workers_claims_alone(tmp_path):
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    from types import SimpleNamespace
    (tmp_path/'.claims').mkdir(); (tmp_path/'.claims'/'running').touch()
    a = SimpleNamespace(out_dir=str(tmp_path), worker=None, summarise_only=True, workers=1)
    def work(a): raise AssertionError('a summary runs nothing')
    assert e.run_workers(a, work, 'experiments.py') is False
    assert (tmp_path/'.claims'/'running').exists()

def test_a_gauge_sweep_runs_only_the_inits_it_is_given(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT/'scripts'/'gauge_sweep.py'), '--mini', '--threads', '2', '--inits', 'naive', '--ks', '1', '10',
                        '--out-dir', str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    jobs = [json.loads(l)['job'] for l in (tmp_path/'runs.jsonl').read_text().splitlines()]
    assert {j['init'] for j in jobs} == {'naive'} and {j['k'] for j in jobs} == {1.0, 10.0}
    res = json.loads((tmp_path/'gauge.json').read_text())
    assert res['setup']['runs_missing'] == [] and set(res['runs']['uniform:0.25']) == {'naive'}

def test_a_gauge_sweep_reads_its_ledger_by_recipe(tmp_path):
    "The paper's Phase 1 written as 'phase1' is read as 'taylor_phase1'; a taylor+ row of another recipe is run again; gauge_fix is part of a row's recipe."
    sys.path.insert(0, str(ROOT/'scripts'))
    import gauge_sweep as g
    rows = [dict(key=g.job_key(j), setup_id='s', job=j, **extra) for j, extra in [
        (g.job(1.0, 'phase1', 0), {}),                                         # the paper's Phase 1 under its old name
        (g.job(1.0, 'taylor+', 0), {}),                                        # taylor+ of the recipe before Phase 1 by least squares
        (g.job(10.0, 'taylor+', 0, gauge_fix=True), dict(recipe_id=g.recipe_id(g.job(10.0, 'taylor+', 0, gauge_fix=True)))),
        (g.job(30.0, 'taylor+', 0, gauge_fix=True), dict(recipe_id=g.recipe_id(g.job(30.0, 'taylor+', 0)))),   # without the switch it names
    ]]
    (tmp_path/'runs.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
    got = g.read_ledger(tmp_path, 's')
    assert sorted(r['job']['init'] + f" {r['job']['k']}" for r in got.values()) == ['taylor+ 10.0', 'taylor_phase1 1.0']
    assert g.job_key(g.job(1.0, 'taylor_phase1', 0)) in got and g.job_key(g.job(1.0, 'taylor+', 0)) not in got
    assert 'phase1' not in g.INITS and 'taylor_phase1' in g.INITS

def test_a_claim_of_a_finished_process_is_taken_over_and_a_live_one_is_not(tmp_path):
    "A killed run leaves its claims behind: the next worker takes them over, while a running worker's claim stays its own."
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    done = subprocess.run([sys.executable, '-c', 'import os; print(os.getpid())'], capture_output=True, text=True)
    dead_pid = int(done.stdout)                                   # a process that has exited
    d = tmp_path/'.claims'; d.mkdir()
    (d/e.claim_name('gone')).write_text(f'{e._boot_id()} {dead_pid}')
    (d/e.claim_name('running')).write_text(f'{e._boot_id()} {os.getppid()}')      # pytest's parent runs
    (d/e.claim_name('other boot')).write_text(f'not-this-boot {os.getppid()}')
    assert e.claim(tmp_path, 'gone') and not e.claim(tmp_path, 'running') and e.claim(tmp_path, 'other boot')
    assert (d/e.claim_name('gone')).read_text() == f'{e._boot_id()} {os.getpid()}'
    assert e.claim_is_live(d/e.claim_name('gone')) and not e.claim(tmp_path, 'gone')   # now this process's own, and live
    assert e.claim(tmp_path, 'new') and not e.claim_is_live(d/'absent')
    empty = d/e.claim_name('being written'); empty.touch()
    assert not e.claim(tmp_path, 'being written')                 # an empty claim a moment old: its writer is writing
    os.utime(empty, (empty.stat().st_atime, empty.stat().st_mtime - 120))
    assert e.claim(tmp_path, 'being written')                     # a minute later it is a dead writer's (or an older run's)

def test_policies_at_half_kept_rank_the_layers_by_their_quarter_runs_scores(tmp_path):
    "Part 'policy-retention': each policy at 50% kept reuses the scores its 25% run measured (no second selection pass)."
    sys.path.insert(0, str(ROOT/'scripts'))
    import experiments as e
    js = e.jobs(['policy-retention'], 1)
    assert {(j['keep'], j['init']) for j in js} == ({(f'{p}:0.5', i) for p in e.POLICY_RETENTION for i in e.RETENTION_INITS}
                                                   | {('ar:0.25', 'naive'), ('retrieval:0.25', 'naive')} | {('ga-s2:0.25', i) for i in e.RETENTION_INITS})
    pos = {e.job_key(j): n for n, j in enumerate(js)}
    assert all(pos[e.job_key(e.selection_source(j))] < pos[e.job_key(j)] for j in js if j['keep'].endswith(':0.5'))
    assert e.selection_source(e.zero_shot_job('ga-s2:0.5', 'taylor', 1)) == e.zero_shot_job('ga-s2:0.25', 'taylor', 0)
    r = run(tmp_path, '--parts', 'policy-retention', '--inits', 'naive', '--workers', '1')
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {(l['job']['keep']): l for l in map(json.loads, (tmp_path/'runs.jsonl').read_text().splitlines())}
    assert set(rows) == {f'{p}:{f}' for p in e.POLICY_RETENTION for f in (0.25, 0.5)}
    for p in e.POLICY_RETENTION:
        quarter, half = rows[f'{p}:0.25'], rows[f'{p}:0.5']
        assert len(half['kept']) == 4 and set(quarter['kept']) < set(half['kept'])      # 8 layers: 2 kept, then 4
        assert half['selection'] is None                                                 # it measured no scores of its own
        ranked = sorted(quarter['selection']['scores'].items(), key=lambda t: (float(t[1]) * (1 if p == 'ga-s2' else -1), int(t[0])))
        assert half['kept'] == sorted(int(l) for l, _ in ranked[:4])
    res = json.loads((tmp_path/'experiments.json').read_text())
    assert {f'{p}:0.5|naive' for p in e.POLICY_RETENTION} <= set(res['retention'])

def test_a_run_whose_layer_source_is_filtered_out_is_skipped_not_awaited(tmp_path):
    r = run(tmp_path, '--parts', 'grid', '--seeds', '1', '--policies', 'ar', '--inits', 'taylor')   # ar:0.25 naive selects; not listed
    assert r.returncode == 0, r.stderr[-3000:]
    assert 'skipped init=taylor|keep=ar:0.25' in r.stdout and not (tmp_path/'runs.jsonl').exists()

def test_a_summary_of_another_setups_ledger_fails_and_keeps_the_old_summary(tmp_path):
    row = dict(key='init=naive|keep=uniform:0.25|kind=zero_shot|kv_copy=heads|seed=0', setup_id='another', job=dict(init='naive'))
    (tmp_path/'runs.jsonl').write_text(json.dumps(row) + '\n'); (tmp_path/'experiments.json').write_text('{"kept": true}')
    r = run(tmp_path, '--summarise-only')
    assert r.returncode != 0 and 'none of setup' in r.stderr, r.stderr[-3000:]
    assert (tmp_path/'experiments.json').read_text() == '{"kept": true}'

def test_naming_the_default_teacher_summarises_the_default_ledger(tmp_path):
    "`--teacher tiny-qwen2` names the default teacher: its runs are the default ledger's (one setup), not a setup of their own."
    (tmp_path/'runs.jsonl').write_bytes((ROOT/'bench'/'results'/'experiments'/'runs.jsonl').read_bytes())
    r = subprocess.run([sys.executable, str(ROOT/'scripts'/'experiments.py'), '--teacher', 'tiny-qwen2', '--summarise-only',
                        '--out-dir', str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((tmp_path/'experiments.json').read_text())['setup']['runs_done'] > 0

def test_a_reproduced_run_matches_its_ledger_row_and_is_recorded_once(tmp_path):
    "`--reproduce REGEX` runs matching ledger runs again from scratch on the layers they kept, and records both perplexities."
    r = run(tmp_path, '--parts', 'uniform', '--seeds', '1', '--inits', 'naive,taylor', '--workers', '1')
    assert r.returncode == 0, r.stderr[-3000:]
    ledger = (tmp_path/'runs.jsonl').read_text()
    r = run(tmp_path, '--parts', 'uniform', '--seeds', '1', '--reproduce', r'init=taylor\|')
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(l) for l in (tmp_path/'reproduced.jsonl').read_text().splitlines()]
    assert [r['job']['init'] for r in rows] == ['taylor']               # the regular expression picks taylor, not naive
    assert abs(rows[0]['ppl'] / rows[0]['ledger_ppl'] - 1) < 1e-3 and rows[0]['ledger_ppl'] != rows[0]['valid_ppl']
    assert (tmp_path/'runs.jsonl').read_text() == ledger                # the ledger is read, never written
    res = json.loads((tmp_path/'experiments.json').read_text())
    assert [r['ppl'] for r in res['reproduced']] == [rows[0]['ppl']]
    r = run(tmp_path, '--parts', 'uniform', '--seeds', '1', '--reproduce', 'init=taylor')
    assert r.returncode == 0 and len((tmp_path/'reproduced.jsonl').read_text().splitlines()) == 1   # already reproduced: not run again
