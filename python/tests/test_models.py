"""Small torchvision and transformers models, trained under half their peak,
equal stock PyTorch bit for bit: architectures beyond the ones the other
tests build by hand (depthwise and squeeze-excite convolutions, channel
shuffles, T5's relative attention, Llama's rotary embeddings and grouped
keys, BERT's masked LM)."""

import pytest

torch = pytest.importorskip("torch")
import dtr.torch  # noqa: E402,F401  (a missing build fails, not skips)
from test_budget import check_under_ratios  # noqa: E402


def vision(name, batch, image):
    models = pytest.importorskip("torchvision.models")
    torch.manual_seed(0)
    model = getattr(models, name)(num_classes=10)
    batches = [(torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,)))
               for _ in range(2)]

    def loss(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])
    return model, lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), batches, loss


def language(name, **config):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model_class = getattr(transformers, name)
    model = model_class(model_class.config_class(**config))
    ids = [torch.randint(1, 256, (8, 96)) for _ in range(2)]
    if name.startswith("T5"):
        batches = [dict(input_ids=i, labels=torch.randint(1, 256, (8, 64))) for i in ids]
    elif name.startswith("Bert"):  # masked LM: loss on a fifth of the tokens
        masks = [torch.rand(i.shape) < 0.8 for i in ids]
        batches = [dict(input_ids=i, labels=i.masked_fill(m, -100)) for i, m in zip(ids, masks)]
    else:
        batches = [dict(input_ids=i, labels=i) for i in ids]
    return model, lambda p: torch.optim.AdamW(p, lr=1e-3), batches, lambda m, b: m(**b).loss


SMALL = dict(vocab_size=256)
MODELS = {
    "mobilenet_v3_small": lambda: vision("mobilenet_v3_small", 8, 128),
    "shufflenet_v2_x0_5": lambda: vision("shufflenet_v2_x0_5", 8, 128),
    "bert": lambda: language("BertForMaskedLM", **SMALL, hidden_size=64, num_hidden_layers=2,
                             num_attention_heads=4, intermediate_size=128,
                             max_position_embeddings=128),
    "t5": lambda: language("T5ForConditionalGeneration", **SMALL, d_model=64, d_kv=16, d_ff=128,
                           num_layers=2, num_decoder_layers=2, num_heads=4,
                           decoder_start_token_id=0, pad_token_id=0),
    "llama": lambda: language("LlamaForCausalLM", **SMALL, hidden_size=64,
                              intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=128, attention_dropout=0.1),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_small_models_train_bitwise_under_half_their_peak(name):
    check_under_ratios(*MODELS[name](), ratios=(0.5,))
