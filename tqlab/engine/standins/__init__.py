"""vLLM 0.33's workspace call sites other than TurboQuant's, as engine stand-ins (issue 19).

Each module has vLLM's file name and each method vLLM's function name, so a call the locked workspace
refuses raises the same ``Workspace is locked but allocation from 'file.py:LINE:function' requires X MB,
current size is Y MB`` error vLLM raises (the line is this file's). A stand-in does no MoE or MLA
arithmetic: it only asks the engine's :class:`~tqlab.core.workspace.WorkspaceManager` for the shapes
that the consumer modules of :mod:`tqlab.core.consumers` compute (one source of truth).
:mod:`tqlab.engine.consumer_standins` decides which stand-ins a deployment has and runs them in the
phase where vLLM makes each call.
"""
