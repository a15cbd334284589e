"The console script: --help, --version, and one-line errors (never a traceback) for bad input."
import subprocess, sys
from pathlib import Path
import taylor_calibrate

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
    from taylor_calibrate.teacher import SHIPPED_TEACHERS, REGISTRY_TEACHERS
    helps = {(cmd, a.dest): ' '.join(a.help.split()) for cmd, a in _options(build_parser()) if a.dest in ('data', 'teacher')}
    assert {c for c, d in helps if d == 'teacher'} == {'demo', 'diagnose', 'convert', 'distill'}
    for (cmd, dest), h in helps.items():
        if dest == 'teacher': assert all(n in h for n in [*SHIPPED_TEACHERS, *REGISTRY_TEACHERS, '.gguf']), (cmd, h)
        else: assert all(w in h for w in ('train', 'valid', 'text files', 'comma-separated', 'NAME:CONFIG:SPLIT')), (cmd, h)

def test_the_parsers_literals_are_the_librarys_lists():
    from taylor_calibrate import cli, convert, core, distill, teacher
    assert set(cli._LAYOUTS) == set(convert.EXPORT_LAYOUTS) and cli._POLICIES == convert.POLICIES
    assert cli._INITS == tuple(core.RECIPES) and set(cli._SCHEDULES) == set(distill.SCHEDULES)
    assert cli._SHIPPED == tuple(teacher.SHIPPED_TEACHERS) and set(cli._REGISTRY) == set(teacher.REGISTRY_TEACHERS)

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
        (lambda: regime.regime_table(None, inits=()), 'inits=(', 'e.g. --inits naive,phase1'),
        (lambda: regime.regime_table(None, data='valid', heldout='valid'), 'heldout="valid"', '(e.g. --heldout valid)'),
    ]
    for f, api, cli in cases:
        msg = _message(f)
        assert api in msg, msg                                  # the library speaks to callers of the API
        assert cli in _cli_wording(msg), _cli_wording(msg)      # the command line names its options
    r = run('convert', '--teacher', 'tiny-qwen2', '--out', str(tmp_path/'full'))
    assert r.returncode == 1 and 'pass --overwrite to replace' in r.stderr and 'overwrite=True' not in r.stderr, r.stderr
