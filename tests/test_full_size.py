"The full-size benchmark's shapes and cost model (bench/full_size.py): published configs, and the same capture grouping as calibrate."
import sys
import torch
from transformers import AutoModelForCausalLM


def full_size(root):
    sys.path.insert(0, str(root / 'bench'))
    import full_size
    return full_size


def test_published_shapes(root):
    F = full_size(root)
    q, q3, ll = F.config_for('Qwen2.5-0.5B'), F.config_for('Qwen3-0.6B'), F.config_for('Llama-3.2-1B')
    assert (q.hidden_size, q.num_hidden_layers, q.num_attention_heads, q.num_key_value_heads, q.vocab_size) == (896, 24, 14, 2, 151936)
    assert q.tie_word_embeddings and q.rope_parameters['rope_theta'] == 1e6
    assert (q3.head_dim, q3.num_key_value_heads, q3.num_hidden_layers) == (128, 8, 28)
    assert ll.rope_parameters['rope_type'] == 'llama3' and ll.rope_parameters['factor'] == 32.0 and ll.vocab_size == 128256
    sm = F.config_for('SmolLM2-135M')   # the registry teacher's shape (tests/test_real_teacher.py loads the teacher itself)
    assert (sm.hidden_size, sm.num_hidden_layers, sm.num_attention_heads, sm.num_key_value_heads, sm.vocab_size) == (576, 30, 9, 3, 49152)
    # parameter counts from the configs match the models' (embeddings tied), within the biases and norms left out
    for name, billions in (('Qwen2.5-0.5B', 0.494), ('Qwen3-0.6B', 0.596), ('Llama-3.2-1B', 1.236), ('Qwen2.5-3B', 3.086), ('Qwen3-8B', 8.19),
                          ('SmolLM2-135M', 0.1345)):
        assert abs(F.all_params(F.config_for(name)) / 1e9 - billions) < 0.01 * billions, name


def test_cost_model_groups_captures_as_calibrate_does(root):
    from taylor_calibrate.core import capture_groups
    F = full_size(root)
    for name in F.RUN:
        c = F.config_for(name, quick=True)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(c)
        conv = F.converted_layers(c)
        for tokens in (2048, 18432, 200_000):
            assert F.capture_layer_groups(c, conv, tokens)[0] == capture_groups(model, conv, tokens), (name, tokens)
    c = F.config_for('Qwen2.5-0.5B')
    assert F.teacher_pass_flops(c, 1000, depth=12) * 2 == F.teacher_pass_flops(c, 1000)
    m = F.cost_model(c, 'taylor+', F.recipe_budget('taylor+'))
    assert m['converted'] == 18 and m['capture_groups'] == 18 and m['phase2_flops'] > 0
    assert F.cost_model(c, 'naive', F.recipe_budget('naive'))['phase2_flops'] == 0

def test_cost_model_counts_one_teacher_pass_per_window_set(root):
    F = full_size(root)
    c, b = F.config_for('Qwen2.5-0.5B'), F.recipe_budget('taylor+')
    tokens = b['calib_tokens'] + b['heldout_tokens']
    assert F.cost_model(c, 'taylor+', b)['teacher_flops'] == F.teacher_pass_flops(c, tokens, 24)   # through layer 23, the last converted
