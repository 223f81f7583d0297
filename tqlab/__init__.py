"""tqlab: vLLM WorkspaceManager, TurboQuant and the locked-workspace crash, live."""

__version__ = "0.1.0"
