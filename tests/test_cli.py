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
