"""The refresh engine: a Function's column brought current on a LanceDB table, checkpointed, one
commit per refresh. It owns no process: where a Function's loaded instance lives is behind the
seam `worker.InstanceSource` / `worker.FunctionInstance`, which the embedded wing implements
(`embedded.warm`) and a step without one fills in its own process.

May import: function_spec, top-level modules.
Never imports: run, run.k8s, embedded, assets, components, kubernetes, dagster_k8s.
"""
