"""Beyond one node: SGLang's router in front of the engines (``router.py``), engines started
elsewhere (``external.py``), the multi-node layout (``nodes.py``) and its SLURM script
(``slurm.py``)."""
