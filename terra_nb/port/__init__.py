"""The port: what a user copies into their own project.

Terra's config and token layout, the HF model (v1 and v2), random checkpoints in the released
format (`checkpoints`: what the port's parity tests load), the vLLM V1 port (the `actions`
modality, the model, the plugin, the front door, the 0.26/0.32 shim), rollouts on HF and vLLM,
frame-copy speculation and sessions. Nothing here imports the rest of `terra_nb`: the workbook
passes its own settings as engine arguments.
"""
