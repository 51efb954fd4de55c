"""Terra on ONNX Runtime (notebook 09): the other road out of PyTorch, beside the vLLM port.

`export`: the HF model as one merged KV-cache decoding graph (`torch.onnx.export(dynamo=True)`);
`rollout`: that graph rolled out on onnxruntime, with the signature of `terra_nb.port.rollout.hf_rollout`.
"""
