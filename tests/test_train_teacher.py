"The teacher training script: the Qwen3 teacher is trained on exactly the token stream its saved tokenizer gives, and a resumed run continues bit for bit."
import torch
from safetensors.torch import load_file
from taylor_calibrate.teacher import load_teacher, corpus_token_ids, shipped_teachers
import train_teacher


def test_qwen3_training_stream_is_the_shipped_pipeline(tmp_path):
    assert 'tiny-qwen3' in shipped_teachers()
    tok, train_ids, valid_ids = train_teacher.training_token_ids(tmp_path)     # what the training loop consumes
    shipped_tok = load_teacher('tiny-qwen3')[1]
    assert type(shipped_tok).__name__ == type(tok).__name__
    assert torch.equal(train_ids, corpus_token_ids(shipped_tok, 'train'))
    assert torch.equal(valid_ids, corpus_token_ids(shipped_tok, 'valid'))
    # the Qwen2 recipe's first stage tokenised differently (a plain byte-level pipeline): the streams really differ
    plain = train_teacher.token_stream(train_teacher.train_tokenizer(train_teacher.read_split('valid')[:20], 8192),
                                       train_teacher.read_split('valid')[:20])
    assert not torch.equal(plain, corpus_token_ids(shipped_tok, 'valid', plain.numel()))


TINY = dict(train_teacher.QWEN3_RECIPE, num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            head_dim=16, seq_len=64, batch_size=2, steps=6, eval_every=3, warmup=2)


def test_resumed_training_is_bit_identical(tmp_path):
    straight = train_teacher.main(TINY, threads=1, out=tmp_path/'straight')
    ck = tmp_path/'ckpt'
    first = train_teacher.main(TINY, threads=1, out=tmp_path/'resumed', checkpoint_dir=ck, stop_after=4)
    assert len(first['loss']) == 4 and not (tmp_path/'resumed'/'model.safetensors').exists()
    resumed = train_teacher.main(TINY, threads=1, out=tmp_path/'resumed', checkpoint_dir=ck)
    assert resumed['resumed_at'] == [4] and resumed['loss'] == straight['loss'] and resumed['valid_loss'] == straight['valid_loss']
    a, b = load_file(tmp_path/'straight'/'model.safetensors'), load_file(tmp_path/'resumed'/'model.safetensors')
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # a checkpoint of another recipe is refused, and left as it was
    before = (ck/'checkpoint.pt').read_bytes()
    try: train_teacher.main(dict(TINY, lr=1e-3), threads=1, out=tmp_path/'other', checkpoint_dir=ck); raise AssertionError('no error')
    except ValueError as e: assert 'another recipe' in str(e)
    assert (ck/'checkpoint.pt').read_bytes() == before
