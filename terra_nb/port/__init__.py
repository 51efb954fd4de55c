"""The port: what a user copies into their own project.

Terra's config and token layout, the HF model (v1 and v2), the vLLM V1 port (the `actions`
modality, the model, the plugin, the front door, the release shim), rollouts on HF and vLLM, and
sessions. Nothing here imports the rest of `terra_nb`: the workbook passes its own settings as
engine arguments, and writes the random checkpoints the tests load (`workbook.checkpoints`).
"""
