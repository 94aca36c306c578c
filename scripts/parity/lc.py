import sys, json, numpy as np, llama_cpp
from llama_cpp import Llama
fx = json.load(open('tests/fixtures/text/smollm2-135m-instruct-q4_1.json'))
case, step = int(sys.argv[1]), int(sys.argv[2])
kw = eval(sys.argv[3]) if len(sys.argv) > 3 else {}
c = fx['cases'][case]
ids = c['prompt_ids'] + c['greedy_ids'][:step]
llm = Llama(model_path='weights/SmolLM2-135M-Instruct.Q4_1.gguf', n_ctx=2048, n_batch=512, n_threads=2, seed=0, verbose=False, **kw)
llm.reset(); llm.eval(c['prompt_ids'])
for t in c['greedy_ids'][:step]:
    llm.eval([t])
lg = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).copy()
ref = np.load(f'/tmp/parity_ref_{case}_{step}.npy')
top = np.argsort(-lg)[:4]
print(kw, 'llama.cpp top', [(int(i), round(float(lg[i]),3)) for i in top], 'exact', [(int(i), round(float(ref[i]),3)) for i in top], 'maxdiff', float(np.abs(lg-ref).max()), 'mean shift', float((lg-ref).mean()))
lg.astype(np.float32).tofile(f'/tmp/lc_{case}_{step}.f32')
