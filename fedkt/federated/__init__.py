"""What federated learning adds around a model: what travels and how it is combined.

* :mod:`fedkt.federated.payload`: the wire format of every message (:class:`Payload`);
* :mod:`fedkt.federated.aggregation`: FedAvg of tensors and the checks on what is averaged;
* :mod:`fedkt.federated.compression`: SVD compression (FedKD Eqs. 8-9), an update's wire form;
* :mod:`fedkt.federated.privacy`: client-side differential privacy and its accountant.
"""
