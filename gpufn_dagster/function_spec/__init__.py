"""What a Function is, apart from Dagster and the engine: its options (declared once for the
decorator, the spec builder and YAML), the spec itself, what its version covers, and the Arrow
type names YAML uses. Pure: nothing here reads a table or talks to a server.

May import: top-level modules.
Never imports: run, run.k8s, embedded, refresh, assets, components, kubernetes, dagster_k8s.
"""
