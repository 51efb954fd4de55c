"""Teaching helpers: the code notebooks 01-06, 09 and 12 use to show the port at work.

HF lessons (01), inspecting vLLM's front end and engine (03-04), weight mapping (05), tracing
the vLLM forward (06), pitfalls and parity checks (03, 06, 09), frame-copy speculation (12). They
import the port; the port never imports them.
"""
