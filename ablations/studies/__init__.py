"""The study files (``*.yaml`` here, the shared base files in ``protocol/``) and what defines a stored study: the
loader (``spec``), the ``--set`` overrides (``overrides``), the storage URL and its checks (``storage``) and the stop
signals held during a storage call (``stopping``). Used by ``ablations.run`` (which runs a study) and
``ablations.report`` (which reads one). Importing the package loads none of them."""
