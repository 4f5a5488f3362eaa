"""WorkloadIR (seed 003): hardware-independent description of a model's layers, ops, FLOPs and bytes."""

from services.workload.ir.breakdown import CommPattern, MemoryFootprint, OpsBreakdown
from services.workload.ir.graph import WorkloadGraph
from services.workload.ir.hf_config import SUPPORTED, from_hf_config
from services.workload.ir.ir import DeepSeekModel, LlamaModel, TransformerModel, WorkloadIR, build_ir
from services.workload.ir.layer import Layer
from services.workload.ir.metadata import ModelMetadata
from services.workload.ir.model_config import MambaConfig, MLAConfig, ModelConfig, MoEConfig
from services.workload.ir.op import Op
from services.workload.ir.specs import CommSpec, ComputeSpec, MemorySpec
from services.workload.ir.tensor import TensorDesc

__all__ = [
    "SUPPORTED",
    "CommPattern",
    "CommSpec",
    "ComputeSpec",
    "DeepSeekModel",
    "Layer",
    "LlamaModel",
    "MLAConfig",
    "MambaConfig",
    "MemoryFootprint",
    "MemorySpec",
    "MoEConfig",
    "ModelConfig",
    "ModelMetadata",
    "Op",
    "OpsBreakdown",
    "TensorDesc",
    "TransformerModel",
    "WorkloadGraph",
    "WorkloadIR",
    "build_ir",
    "from_hf_config",
]
