"""The port: what a user copies into their own project.

Terra's config and token layout, the HF model (v1 and v2), checkpoints, the vLLM V1 port (the
`actions` modality, the model, the plugin, the front door, the 0.26/0.32 shim), rollouts on HF and
vLLM, and the ONNX export with its onnxruntime rollout. Nothing here imports the teaching helpers
(`terra_nb.lessons`) or the workbook tooling (`terra_nb.workbook`).
"""
