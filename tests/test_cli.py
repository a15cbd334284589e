"The console script: --help, --version, and one-line errors (never a traceback) for bad input."
import subprocess, sys
from pathlib import Path
import taylor_calibrate
from conftest import ROOT

EXE = str(Path(sys.executable).with_name('taylor-calibrate'))

def run(*args): return subprocess.run([EXE, *args], capture_output=True, text=True)

def test_version():
    r = run('--version')
    assert r.returncode == 0 and r.stdout.strip() == f'taylor-calibrate {taylor_calibrate.__version__}'

def test_help():
    r = run('--help')
    assert r.returncode == 0 and 'usage: taylor-calibrate' in r.stdout

def test_bad_subcommand_and_flag():
    for args in (['no-such-command'], ['--no-such-flag']):
        r = run(*args)
        assert r.returncode == 2 and 'Traceback' not in r.stderr
        assert 'error:' in r.stderr and 'usage:' in r.stderr

def test_distill_bad_accumulation_schedule_and_fsdp():
    "distill's --grad-accum and --schedule are checked by the parser (exit 2); under FSDP it refuses in one line (exit 1), before loading anything."
    base = ['distill', '--student', 'no-such-dir', '--tokens', '64', '--out', 'no-such-out']
    for extra, msg in ((['--grad-accum', '0'], "argument --grad-accum: must be a positive integer, got '0'"),
                       (['--schedule', 'sawtooth'], "argument --schedule: invalid choice: 'sawtooth'")):
        r = run(*base, *extra)
        assert r.returncode == 2 and 'Traceback' not in r.stderr and msg in r.stderr, r.stderr
    for extra, msg in ((['--needles', '2'], '--needles is a share of the training windows, from 0 to 1; got 2.0'),
                       (['--needles', '0.5', '--seq-len', '128'], '--needles needs windows of 256 tokens or more')):
        r = run(*base, *extra)                          # before any model is loaded: the student folder does not exist
        assert r.returncode == 1 and r.stderr.count('\n') == 1 and msg in r.stderr, r.stderr
    import os
    r = subprocess.run([EXE, *base], capture_output=True, text=True, env=dict(os.environ, ACCELERATE_USE_FSDP='true'))
    assert r.returncode == 1 and r.stderr.count('\n') == 1 and 'FSDP-sharded student' in r.stderr, r.stderr

def _options(parser):
    "Every (command, action) of `parser` and its subcommands."
    import argparse
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sp in a.choices.items(): yield from ((f'{name} {c}'.strip(), b) for c, b in _options(sp))
        else: yield '', a

def test_every_option_has_help():
    from taylor_calibrate.cli import build_parser
    missing = [f'{cmd} {"/".join(a.option_strings) or a.dest}' for cmd, a in _options(build_parser())
               if '-h' not in a.option_strings and not (a.help or '').strip()]
    assert not missing, f'options without help: {missing}'

def test_data_and_teacher_help_name_what_they_take():
    from taylor_calibrate.cli import build_parser
    from taylor_calibrate.teacher import SHIPPED_TEACHERS, REGISTRY_TEACHERS, CACHE_ENV, DEFAULT_CACHE
    helps = {(cmd, a.dest): ' '.join(a.help.split()) for cmd, a in _options(build_parser()) if a.dest in ('data', 'teacher')}
    assert {c for c, d in helps if d == 'teacher'} == {'demo', 'diagnose', 'convert', 'distill', 'explore', 'probe'}
    for (cmd, dest), h in helps.items():
        if dest == 'teacher': assert all(n in h for n in [*SHIPPED_TEACHERS, *REGISTRY_TEACHERS, '.gguf', CACHE_ENV, DEFAULT_CACHE]), (cmd, h)
        else: assert all(w in h for w in ('train', 'valid', 'text files', 'comma-separated', 'NAME:CONFIG:SPLIT')), (cmd, h)

def test_the_parsers_literals_are_the_librarys_lists():
    from taylor_calibrate import cli, convert, core, distill, probes, teacher
    assert set(cli._LAYOUTS) == set(convert.EXPORT_LAYOUTS) and cli._POLICIES == convert.POLICIES
    assert cli._INITS == tuple(core.RECIPES) and set(cli._SCHEDULES) == set(distill.SCHEDULES)
    assert cli._SHIPPED == tuple(teacher.SHIPPED_TEACHERS) and set(cli._REGISTRY) == set(teacher.REGISTRY_TEACHERS)
    assert cli._PROBES == probes.PROBES and cli._CACHE == (teacher.CACHE_ENV, teacher.DEFAULT_CACHE)

def test_demo_takes_shipped_registry_and_gguf_teachers():
    from taylor_calibrate.cli import _demo_teacher, _teacher_origin
    from taylor_calibrate.teacher import known_teachers
    assert [_demo_teacher(n) for n in [None, *known_teachers(), 'm.gguf']] == [None, *known_teachers(), 'm.gguf']
    assert 'dequantised' in _teacher_origin('smollm2-135m') and _teacher_origin(None) == 'shipped with the package'
    r = run('demo', '--teacher', 'Qwen/Qwen3-0.6B')
    assert r.returncode == 1 and r.stderr.count('\n') == 1 and 'convert takes any teacher' in r.stderr, r.stderr
    assert 'smollm2-135m' in r.stderr

def _message(f) -> str:
    try: f()
    except (ValueError, OSError) as e: return str(e)
    raise AssertionError('no error')

def test_api_wording_becomes_command_line_wording(tmp_path):
    "Library messages that name keyword arguments name the options on the command line; the library's own stay as they are."
    import torch
    from taylor_calibrate import core, distill, regime, teacher
    from taylor_calibrate.cli import _cli_wording
    from taylor_calibrate.outputs import check_output_dir
    (tmp_path/'full').mkdir(); (tmp_path/'full'/'x').write_text('x'); (tmp_path/'ck'/distill.CKPT).mkdir(parents=True)
    ids = torch.arange(64)
    cases = [   # (library message, its API words, the command line's)
        (lambda: check_output_dir(tmp_path/'full'), 'pass overwrite=True', 'pass --overwrite to replace'),
        (lambda: distill.latest_checkpoint(tmp_path/'ck'), 'resume=False', 'name another --checkpoint-dir'),
        (lambda: core.calibrate(None, 'train', steps=0), "init='phase1'", 'use --init phase1'),
        (lambda: core.token_windows(ids, None, 512), 'seq_len=512', 'one window of --seq-len 512'),
        (lambda: teacher.perplexity(None, ids, seq_len=1), 'seq_len must', '--seq-len must be at least 2'),
        (lambda: distill.distill(None, None, ids, tokens=64, warmup_tokens=8), 'with warmup_tokens',
         'use --schedule constant_with_warmup (or another schedule) with --warmup-tokens'),
        (lambda: distill.distill(None, None, ids, tokens=64, warmup_tokens=128, schedule='cosine'), 'budget tokens',
         '--warmup-tokens 128 exceeds the budget --tokens 64'),
        (lambda: distill.distill(None, None, ids, tokens=0), 'tokens must', '--tokens must be a positive integer'),
        (lambda: distill.distill(None, None, ids, tokens=64, batch_size=0), 'batch_size must', '--batch-size must be at least 1'),
        (lambda: distill.distill(None, None, ids, tokens=64, ce_weight=-1), 'ce_weight must', '--ce-weight must be >= 0'),
        (lambda: regime.regime_table(None, inits=()), 'inits=(', 'e.g. --inits naive,taylor_phase1'),
        (lambda: regime.regime_table(None, data='valid', heldout='valid'), 'heldout="valid"', '(e.g. --heldout valid)'),
    ]
    for f, api, cli in cases:
        msg = _message(f)
        assert api in msg, msg                                  # the library speaks to callers of the API
        assert cli in _cli_wording(msg), _cli_wording(msg)      # the command line names its options
    r = run('convert', '--teacher', 'tiny-qwen2', '--out', str(tmp_path/'full'))
    assert r.returncode == 1 and 'pass --overwrite to replace' in r.stderr and 'overwrite=True' not in r.stderr, r.stderr

def test_threads_on_every_command_that_computes():
    "demo, diagnose, convert, distill and explore take --threads: auto (the default), a count, or 0 for torch's default."
    from taylor_calibrate.cli import build_parser
    p = build_parser()
    base = {'demo': [], 'diagnose': [], 'convert': ['--teacher', 't', '--out', 'o'], 'distill': ['--student', 's', '--tokens', '8', '--out', 'o'],
            'explore': []}
    for cmd, args in base.items():
        assert p.parse_args([cmd, *args]).threads == 'auto'
        assert [p.parse_args([cmd, *args, '--threads', n]).threads for n in ('0', '3')] == [0, 3]
    r = run('demo', '--threads', '-1')
    assert r.returncode == 2 and "argument --threads: must be auto or an integer >= 0, got '-1'" in r.stderr, r.stderr

def test_auto_threads(monkeypatch):
    "auto: OMP_NUM_THREADS if set; one thread for the shipped teachers; else (the registry teacher too) the cores not busy, at most torch's default."
    from taylor_calibrate.cli import choose_threads
    monkeypatch.delenv('OMP_NUM_THREADS', raising=False)
    assert [choose_threads('auto', t)[0] for t in (None, 'tiny-qwen2', 'tiny-qwen3')] == [1, 1, 1]
    assert [choose_threads('auto', 'smollm2-135m', cores=2, load=l)[0] for l in (0.1, 1.2, 3.0)] == [2, 1, 1]
    assert [choose_threads('auto', 'Qwen/Qwen3-0.6B', cores=16, load=l)[0] for l in (0.2, 3.4, 15.9, 40.0)] == [16, 13, 1, 1]
    assert choose_threads('auto', './my-model', cores=16, load=0.0, most=8)[0] == 8
    assert choose_threads(0, None) == (None, "--threads 0: torch's own default, one per core")
    monkeypatch.setenv('OMP_NUM_THREADS', '3')
    assert choose_threads('auto', None) == (3, 'OMP_NUM_THREADS=3') and choose_threads(2, None) == (2, '--threads 2')

def test_the_early_teacher_check_is_load_teachers():
    "The command line's 'did you mean' (before torch is imported) says what load_teacher's says, for the same names."
    from taylor_calibrate.cli import _check_teacher_name
    from taylor_calibrate.teacher import check_teacher_name
    for name in ('tiny_qwen2', 'tiny-qwen', 'tinyqwen3', 'smollm2', 'smolm2-135m', 'Qwen/Qwen3-0.6B', 'gpt2', './x', 'tiny-qwen2', 'a/b/c'):
        assert _message_or_none(lambda: _check_teacher_name(name)) == _message_or_none(lambda: check_teacher_name(name)), name
    assert "did you mean 'tiny-qwen2'?" in _message_or_none(lambda: _check_teacher_name('tiny_qwen2'))

def _message_or_none(f):
    try: f()
    except ValueError as e: return str(e)
    return None

def _written_notebook(stdout: str) -> Path:
    "The notebook `explore` says it wrote (its second line: 'wrote PATH: ...')."
    line = stdout.splitlines()[1]
    assert line.startswith('wrote '), stdout
    return Path(line.split()[1].rstrip(':'))

def test_explore_dry_run_writes_two_cells_into_a_new_temporary_folder(tmp_path):
    "explore writes its notebook into a new folder under the temporary directory, never where it is run, and passes options to jupyter lab."
    import json, os, nbformat
    cwd, tmp = tmp_path/'work', tmp_path/'tmp'
    cwd.mkdir(); tmp.mkdir(); (cwd/'explore.ipynb').write_text('mine')
    env = {k: v for k, v in os.environ.items() if k != 'OMP_NUM_THREADS'} | {'TMPDIR': str(tmp)}
    r = subprocess.run([EXE, 'explore', '--dry-run', '--no-browser', '--', '--port', '8890'], capture_output=True, text=True, cwd=cwd, env=env)
    assert r.returncode == 0 and not r.stderr, r.stderr
    nb_path = _written_notebook(r.stdout)
    assert nb_path.name == 'explore.ipynb' and nb_path.parent.parent == tmp and nb_path.parent.name.startswith('taylor-calibrate-explore-')
    assert sorted(p.name for p in cwd.iterdir()) == ['explore.ipynb'] and (cwd/'explore.ipynb').read_text() == 'mine'
    nb = nbformat.read(nb_path, as_version=4); nbformat.validate(nb)
    assert [c.cell_type for c in nb.cells] == ['code', 'code'] and nb.metadata.kernelspec.name == 'python3'
    assert nb.cells[0].source.splitlines() == ['import torch', 'from taylor_calibrate.explore import explore', 'torch.set_num_threads(1)   # '
                                               "--threads auto: one for a shipped teacher, whose small per-layer steps gain less from a second core than they lose when it is busy"]
    assert nb.cells[1].source == 'explore()'
    assert r.stdout.splitlines()[0].startswith('threads: 1 (--threads auto')
    import re
    m = re.search(rf'in {re.escape(str(nb_path.parent))} with: (\S+) -m jupyterlab explore.ipynb --no-browser --port 8890$', r.stdout.rstrip())
    assert m and Path(m[1]).samefile(sys.executable), r.stdout                   # the interpreter the package runs in
    r2 = subprocess.run([EXE, 'explore', '--dry-run'], capture_output=True, text=True, cwd=cwd, env=env)
    assert _written_notebook(r2.stdout).parent != nb_path.parent           # a new folder each time

def test_explore_names_the_teacher_so_that_the_notebook_finds_it(tmp_path):
    "A shipped or hub name goes into the notebook as it is; a local folder as an absolute path (the notebook runs elsewhere)."
    import json
    (tmp_path/'my-teacher').mkdir()
    for teacher, call in (('tiny-qwen3', "explore(*load_teacher('tiny-qwen3'))"), ('Qwen/Qwen3-0.6B', "explore(*load_teacher('Qwen/Qwen3-0.6B'))"),
                          ('my-teacher', f"explore(*load_teacher({str(tmp_path/'my-teacher')!r}))"), ('tiny-qwen2', 'explore()')):
        r = subprocess.run([EXE, 'explore', '--dry-run', '--teacher', teacher, '--threads', '2'], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        cells = [c['source'] for c in json.loads(_written_notebook(r.stdout).read_text())['cells']]
        assert cells[1] == call and 'torch.set_num_threads(2)   # --threads 2' in cells[0], cells
    for teacher, msg in (('tiny_qwen3', "did you mean 'tiny-qwen3'?"), ('./no/such/teacher', 'does not exist')):
        r = subprocess.run([EXE, 'explore', '--dry-run', '--teacher', teacher], capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 1 and msg in r.stderr and r.stderr.count('\n') == 1, r.stderr

def test_explore_without_jupyterlab_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    import importlib.util
    from taylor_calibrate import cli
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, 'find_spec', lambda m, *a: None if m == 'jupyterlab' else find(m, *a))
    monkeypatch.setattr(cli.tempfile, 'tempdir', str(tmp_path))
    assert cli.main(['explore']) == 1
    err = capsys.readouterr().err
    assert err == ('taylor-calibrate explore: error: jupyterlab not installed: pip install -e ".[notebooks]" in the package\'s folder '
                   'installs JupyterLab and what the notebooks import\n'), err
    assert list(tmp_path.iterdir()) == []                                   # nothing written before the check

def test_an_unknown_mixer_is_refused_by_the_parser():
    "demo and convert take --mixer gdn, kda or mamba2, and name the choices otherwise (exit 2), before loading anything."
    for cmd in (['demo'], ['convert', '--teacher', 'no-such-teacher', '--out', 'no-such-out']):
        r = run(*cmd, '--mixer', 'mamba')
        assert r.returncode == 2 and 'Traceback' not in r.stderr
        assert "argument --mixer: invalid choice: 'mamba' (choose from 'gdn', 'kda', 'mamba2')" in r.stderr, r.stderr

def test_the_mixer_names_of_the_parser_are_the_hybrids():
    "--mixer takes the names of the mixer table, which the hybrids' layer classes are read from too."
    from taylor_calibrate.cli import build_parser
    from taylor_calibrate.hybrid import MIXERS
    for cmd in ('demo', 'convert'):
        sub = next(a for a in build_parser()._actions if a.dest == 'command').choices[cmd]
        assert next(a for a in sub._actions if a.dest == 'mixer').choices == tuple(MIXERS) == ('gdn', 'kda', 'mamba2')

def test_an_init_one_typo_away_is_named():
    "--init and --inits say which init a typo meant, as --teacher does, before any library loads; a name far from every init gets the list."
    for args, said in ((['convert', '--teacher', 'tiny-qwen2', '--init', 'zero-gate', '--out', 'o'], "unknown init 'zero-gate'; did you mean 'zero_gate'?"),
                       (['demo', '--inits', 'naive,Taylor+'], "unknown init 'Taylor+'; did you mean 'taylor+'?"),
                       (['diagnose', '--inits', 'naive,phase_1'], "unknown init 'phase_1'; did you mean 'phase1'?"),
                       (['demo', '--inits', 'magic'], "unknown init 'magic' (accepted: naive, zero_gate,")):
        r = run(*args)
        assert r.returncode == 1 and r.stderr.count('\n') == 1 and said in r.stderr, r.stderr
    from taylor_calibrate.cli import _close_name
    from taylor_calibrate.teacher import known_teachers
    assert _close_name('tiny_qwen3', known_teachers()) == 'tiny-qwen3' and _close_name('gpt2', known_teachers()) is None

def test_report_of_a_folder_that_does_not_exist_is_one_line(tmp_path):
    for d in (tmp_path/'no-such-run', 'no-such-run'):
        r = run('report', d)
        assert r.returncode == 1 and r.stderr == f'taylor-calibrate report: error: no such folder: {d}\n', r.stderr
    (tmp_path/'file.txt').write_text('x')
    r = run('report', tmp_path/'file.txt')
    assert r.returncode == 1 and r.stderr.count('\n') == 1 and 'file.txt is a file' in r.stderr, r.stderr

def test_a_hybrid_far_off_its_teacher_gets_one_line_of_what_to_try():
    "More than FAR_OFF times the teacher's test perplexity: one line naming this run's settings and what to raise; closer: nothing."
    from types import SimpleNamespace
    from taylor_calibrate.cli import far_off_note, FAR_OFF
    from taylor_calibrate.core import get_recipe
    from dataclasses import asdict
    rep = lambda init: SimpleNamespace(init=init, recipe=asdict(get_recipe(init)))
    assert FAR_OFF == 10 and far_off_note(12.67, 12.67 * FAR_OFF, rep('taylor+'), 'uniform:0.25') is None
    line = far_off_note(12.67, 100_916, rep('taylor+'), 'uniform:0.25')
    assert '\n' not in line and line.startswith("note: the taylor+ hybrid's test perplexity is 7,965 times its teacher's"), line
    for hint in ('--steps 1000', 'this run: 100 a layer', '--keep uniform:0.5', 'ar, ga-s2, retrieval', '--calib-tokens 65536',
                 'it is saved all the same'):
        assert hint in line, (hint, line)
    naive = far_off_note(10, 500, rep('naive'), '0,4')
    assert '--init taylor+' in naive and 'more indices in --keep' in naive and '--steps' not in naive and '--calib-tokens' not in naive

def test_convert_prints_its_teacher_as_demo_does_and_says_when_it_is_far_off(tmp_path, monkeypatch, capsys):
    "convert's first line has demo's form; a hybrid 7,965 times its teacher's perplexity gets the note, and the command still succeeds."
    import re, torch
    from taylor_calibrate import cli, teacher
    monkeypatch.setattr(teacher, 'perplexity', lambda model, ids, **kw: 100_916.0 if hasattr(model, 'calibration_report') else 12.67)
    threads = torch.get_num_threads()
    try: code = cli.main(['convert', '--teacher', 'tiny-qwen2', '--init', 'naive', '--keep', '0,4', '--eval-tokens', '1024',
                          '--threads', '1', '--out', str(tmp_path/'o')])
    finally: torch.set_num_threads(threads)
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and (tmp_path/'o'/'model'/'config.json').exists(), out
    assert out[:2] == ['teacher: tiny-qwen2 (shipped with the package; qwen2, 8 layers); keep 0,4; init naive; evaluating on 1,024 test tokens',
                       'threads: 1 (--threads 1)'], out
    demo_form = r'teacher: (\S+) \((.+); (\w+), (\d+) layers\); keep (\S+)(; \w+ layers)?(; init \S+)?; evaluating on ([\d,]+) test tokens'
    assert re.fullmatch(demo_form, out[0]) and re.fullmatch(demo_form, (ROOT/'bench'/'results'/'demo_output.txt').read_text().splitlines()[1])
    notes = [l for l in out if l.startswith('note: ')]
    assert len(notes) == 1 and "7,965 times its teacher's" in notes[0] and out[-1].startswith(f"wrote {tmp_path/'o'}/"), out
