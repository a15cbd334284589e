"The command line never removes or moves what a user owns: --out checks before any work, --overwrite, killed writes."
import hashlib, os, signal, subprocess, sys, time
from pathlib import Path
import pytest

EXE = str(Path(sys.executable).with_name('taylor-calibrate'))

def run(*args, cwd=None):
    r = subprocess.run([EXE, *map(str, args)], capture_output=True, text=True, cwd=cwd)
    assert 'Traceback' not in r.stderr, r.stderr
    return r

def tree_digest(folder: Path) -> str:
    "sha256 over every path, mode and byte below `folder` (hidden files included)."
    h = hashlib.sha256()
    for p in sorted(folder.rglob('*')):
        h.update(str(p.relative_to(folder)).encode()); h.update(oct(p.stat().st_mode).encode())
        if p.is_file(): h.update(p.read_bytes())
    return h.hexdigest()

def user_folder(path: Path) -> Path:
    (path/'sub').mkdir(parents=True)
    (path/'notes.txt').write_text('my notes'); (path/'sub'/'data.csv').write_text('1,2\n')
    return path

@pytest.fixture(scope='module')
def hybrid_dir(tmp_path_factory):
    "A saved (uncalibrated) hybrid of the shipped Qwen3 teacher, which `export` accepts."
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import to_hybrid
    from taylor_calibrate.hybrid import save_hybrid
    teacher, tok = load_teacher('tiny-qwen3')
    return save_hybrid(to_hybrid(teacher, keep=[0, 4, 8]), tmp_path_factory.mktemp('h')/'hybrid', tok)

@pytest.mark.parametrize('extra', [[], ['--overwrite']])
def test_a_non_empty_folder_of_the_users_is_refused_before_any_work(tmp_path, extra):
    mine = user_folder(tmp_path/'mywork'); before = tree_digest(tmp_path)
    t0 = time.time()
    r = run('convert', '--teacher', tmp_path/'no-such-teacher', '--init', 'taylor', '--out', mine, *extra)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert ('did not write (notes.txt, sub/data.csv)' if extra else 'exists and is not empty') in r.stderr
    assert 'no-such-teacher' not in r.stderr            # the teacher was never looked at
    r = run('demo', '--out', mine, *extra)
    assert r.returncode == 1 and 'mywork' in r.stderr
    assert tree_digest(tmp_path) == before

def test_export_and_distill_refuse_a_users_folder(tmp_path, hybrid_dir):
    mine = user_folder(tmp_path/'userdir'); before = tree_digest(tmp_path)
    for extra in ([], ['--overwrite']):
        r = run('export', hybrid_dir, '--out', mine, *extra)
        assert r.returncode == 1 and 'userdir' in r.stderr, r.stderr
        r = run('distill', '--student', hybrid_dir, '--tokens', '64', '--out', mine, *extra)
        assert r.returncode == 1 and 'userdir' in r.stderr, r.stderr
    assert tree_digest(tmp_path) == before

def test_a_file_as_out_is_refused_and_left_in_place(tmp_path, hybrid_dir):
    (tmp_path/'afile.txt').write_text('precious'); before = tree_digest(tmp_path)
    for extra in ([], ['--overwrite']):
        r = run('export', hybrid_dir, '--out', tmp_path/'afile.txt', *extra)
        assert r.returncode == 1 and 'afile.txt is a file' in r.stderr, r.stderr
    r = run('convert', '--teacher', tmp_path/'t', '--out', tmp_path/'afile.txt'/'inside')
    assert r.returncode == 1 and 'is a file, so no folder' in r.stderr
    assert tree_digest(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ['afile.txt']

def test_out_dot_is_refused(tmp_path, hybrid_dir):
    r = run('export', hybrid_dir, '--out', '.', '--overwrite', cwd=tmp_path)
    assert r.returncode == 1 and 'current folder' in r.stderr
    assert list(tmp_path.iterdir()) == []

def test_overwrite_replaces_only_a_folder_the_package_wrote(tmp_path, hybrid_dir):
    out = tmp_path/'export'
    assert run('export', hybrid_dir, '--out', out).returncode == 0
    assert (out/'.taylor_calibrate_files.json').exists()
    assert oct((out/'model.safetensors').stat().st_mode & 0o044) == oct(0o044)   # readable by others (umask 022)
    r = run('export', hybrid_dir, '--out', out)
    assert r.returncode == 1 and '--overwrite' in r.stderr
    assert run('export', hybrid_dir, '--out', out, '--overwrite').returncode == 0
    (out/'my-notes.md').write_text('mine')
    r = run('export', hybrid_dir, '--out', out, '--overwrite')
    assert r.returncode == 1 and 'did not write (my-notes.md)' in r.stderr
    assert (out/'my-notes.md').read_text() == 'mine'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['export']

KILLED_WRITE = """
import sys, time
from pathlib import Path
from taylor_calibrate.outputs import atomic_dir
def slow(tmp):
    (tmp/'model.safetensors').write_bytes(b'0' * 1_000_000); Path(sys.argv[2]).touch(); time.sleep(600)
atomic_dir(sys.argv[1], slow, overwrite=True)
"""

def test_a_write_killed_with_sigkill_leaves_the_old_output_and_its_temporary_is_cleared(tmp_path, hybrid_dir):
    out = tmp_path/'export'
    assert run('export', hybrid_dir, '--out', out).returncode == 0
    before = tree_digest(out)
    p = subprocess.Popen([sys.executable, '-c', KILLED_WRITE, str(out), str(tmp_path/'started')])
    for _ in range(600):
        if (tmp_path/'started').exists(): break
        time.sleep(0.1)
    os.kill(p.pid, signal.SIGKILL); p.wait()
    (tmp_path/'started').unlink()
    stale = [q.name for q in tmp_path.iterdir() if q.name.startswith('.export.tmp-')]
    assert len(stale) == 1 and tree_digest(out) == before      # the old output intact, one temporary left
    r = run('export', hybrid_dir, '--out', out, '--overwrite')
    assert r.returncode == 0, r.stderr
    assert f'removed {tmp_path/stale[0]}, left by an interrupted write' in r.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == ['export']

def test_export_check_passes_under_the_defaults_on_a_bfloat16_hybrid(tmp_path):
    "The shipped teachers are stored in bfloat16; `export --check` compares hybrid and export in float32, so rounding does not fail it."
    import torch
    from taylor_calibrate.teacher import load_teacher
    from taylor_calibrate.convert import to_hybrid
    from taylor_calibrate.hybrid import save_hybrid
    teacher, tok = load_teacher('tiny-qwen3', dtype=torch.bfloat16)
    save_hybrid(to_hybrid(teacher, keep=[3, 7, 11]), tmp_path/'h', tok)
    r = run('export', tmp_path/'h', '--out', tmp_path/'x', '--check')
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'both in float32' in r.stdout and "serving: vLLM's CPU build refuses GDN head dimension 32" in r.stdout
    import re
    rel = float(re.search(r'\(([0-9.e+-]+) of the largest logit\)', r.stdout)[1])
    assert rel < 2 * 2**-8 and 'are that rounding, not the mapping' in r.stdout, r.stdout   # bfloat16's precision: 2**-8

def test_convert_computes_in_float32_on_a_cpu_under_dtype_auto(tmp_path):
    "A bfloat16 teacher directory converted with the default --dtype auto on a CPU is computed (and saved) in float32."
    import torch
    from taylor_calibrate.teacher import load_teacher
    teacher, tok = load_teacher(dtype=torch.bfloat16)
    teacher.save_pretrained(tmp_path/'teacher'); tok.save_pretrained(tmp_path/'teacher')
    r = run('convert', '--teacher', tmp_path/'teacher', '--init', 'naive', '--out', tmp_path/'o')
    assert r.returncode == 0, r.stderr
    import json
    assert json.loads((tmp_path/'o'/'model'/'config.json').read_text())['dtype'] == 'float32'

def one_line_error(r, *needles):
    lines = [l for l in r.stderr.strip().splitlines() if 'Loading weights' not in l]   # transformers' own progress bar aside
    assert r.returncode == 1 and len(lines) == 1 and all(n in lines[0] for n in needles), r.stderr
    return lines[0]

def test_bad_input_is_one_line_before_any_compute(tmp_path, hybrid_dir):
    "Each bad input ends with exit code 1 and one line on stderr naming the problem; no output folder appears."
    from taylor_calibrate.teacher import teacher_dir
    teacher = teacher_dir()
    (tmp_path/'empty.txt').write_text('')
    (tmp_path/'weights.bin').write_bytes(bytes(range(256)) * 64)
    (tmp_path/'datadir').mkdir()
    cases = [
        (('convert', '--teacher', './no-such-dir'), ('teacher directory no-such-dir does not exist',)),
        (('convert', '--teacher', teacher, '--data', tmp_path/'empty.txt'), ('empty.txt has no text',)),
        (('convert', '--teacher', teacher, '--data', tmp_path/'weights.bin'), ('weights.bin is not a UTF-8 text file',)),
        (('convert', '--teacher', teacher, '--data', tmp_path/'datadir'), ('datadir is a folder',)),
        (('convert', '--teacher', teacher, '--keep', '0,1,2,3,4,5,6,7'), ('keep lists all 8 layers: nothing would be converted',)),
        (('convert', '--teacher', teacher, '--keep', '0,0,99'), ('more than once', 'out of range')),
        (('convert', '--teacher', teacher, '--init', 'magic'), ("unknown init 'magic'",)),
        (('convert', '--teacher', teacher, '--steps', '0'), ('steps=0: a budget must be a positive integer',)),
    ]
    for args, needles in cases:
        one_line_error(run(*args, '--out', tmp_path/'out'), *needles)
    broken = tmp_path/'broken'; broken.mkdir()
    for f in hybrid_dir.iterdir(): (broken/f.name).write_bytes(f.read_bytes())
    (broken/'model.safetensors').write_bytes((hybrid_dir/'model.safetensors').read_bytes()[:5000])
    one_line_error(run('export', broken, '--out', tmp_path/'out'), 'model.safetensors is truncated or not a safetensors file')
    assert not (tmp_path/'out').exists()

def test_an_unknown_hub_name_is_one_line(tmp_path):
    "A bare name that is neither a shipped teacher, a local directory nor (offline here) a hub model: one line."
    r = subprocess.run([EXE, 'convert', '--teacher', 'no-such-model-xyz', '--out', str(tmp_path/'o')], capture_output=True, text=True,
                       env={**os.environ, 'HF_HUB_OFFLINE': '1'})
    one_line_error(r, "'no-such-model-xyz' is no local directory, and the hub gave no model of that name")

def test_a_hub_name_without_a_network_fails_in_seconds(tmp_path):
    "No answer from the hub (here: its endpoint a local port nobody listens on), offline mode unset: one line, no retries; a cached model loads."
    import socket
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ('HF_HUB_OFFLINE', 'TRANSFORMERS_OFFLINE')}
    env.update(HF_ENDPOINT=f'http://127.0.0.1:{port}', HF_HUB_CACHE=str(tmp_path/'hub'))
    t0 = time.time()
    r = subprocess.run([EXE, 'convert', '--teacher', 'someone/no-such-model', '--out', str(tmp_path/'o')], capture_output=True, text=True, env=env)
    one_line_error(r, "'someone/no-such-model' is no local directory, and the hub does not answer", 'connect to the network')
    assert time.time() - t0 < 20 and not (tmp_path/'o').exists()         # the hub library's retries alone wait 23 s
    from taylor_calibrate.teacher import teacher_dir
    snap = tmp_path/'hub'/'models--someone--tiny'/'snapshots'/('0' * 40)    # the hub library's cache holding a model
    snap.mkdir(parents=True); (tmp_path/'hub'/'models--someone--tiny'/'refs').mkdir()
    (tmp_path/'hub'/'models--someone--tiny'/'refs'/'main').write_text('0' * 40)
    for f in teacher_dir().iterdir(): (snap/f.name).write_bytes(f.read_bytes())
    code = ('import time; from taylor_calibrate.teacher import load_teacher; t0 = time.time(); '
            "m, _ = load_teacher('someone/tiny', progress=False); print(m.config.model_type, time.time() - t0)")
    r = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.split()[0] == 'qwen2' and float(r.stdout.split()[1]) < 10, r.stdout + r.stderr[-2000:]
