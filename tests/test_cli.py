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
