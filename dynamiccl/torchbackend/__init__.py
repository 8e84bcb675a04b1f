"""The ``"ina"`` torch backend's code, one module per part (layer: dynamiccl).

Import the backend as :mod:`dynamiccl.torch_backend`: that module registers ``"ina"``
with ``torch.distributed`` and re-exports every public name from here. The modules, each
importing only those listed before it:

- :mod:`~dynamiccl.torchbackend.tensors`: what hostlib carries of a tensor, the staging
  through host memory, the completed ``Work`` of a call run here;
- :mod:`~dynamiccl.torchbackend.exchange`: the store protocol (rank 0 gathers and shares);
- :mod:`~dynamiccl.torchbackend.choosers`: what runs each call (``Chooser``,
  ``resolve_action``);
- :mod:`~dynamiccl.torchbackend.options`: ``InaOptions``, the ``INALAB_*`` variables and
  their reading (the chooser an environment names too);
- :mod:`~dynamiccl.torchbackend.gloo`: the Gloo group delegated to and its interface;
- :mod:`~dynamiccl.torchbackend.rdma`: joining the job over RDMA (RoCEv2 queue pairs);
- :mod:`~dynamiccl.torchbackend.session`: joining the job (install, sessions, removal);
- :mod:`~dynamiccl.torchbackend.collnet`: machines of several ranks (CollNet);
- :mod:`~dynamiccl.torchbackend.group`: ``InaProcessGroup`` and the registration.

Named ``torchbackend``, not ``torch``: a ``dynamiccl/torch/`` would shadow the real
``torch`` for any script run by its path from ``dynamiccl/`` (``python dynamiccl/cli.py``
puts that directory first on ``sys.path``), and ``from dynamiccl import torch`` would
read as torch itself.
"""

__all__: list[str] = []
