"""The fields dcgm-exporter exports (its `customMetrics` value): the chart's default list plus the health fields
the GPU-health alerts read (infra/monitoring/gpu_alerts.py).

The chart takes one complete list or its own default, nothing additive (dcgm-exporter 4.8.2 values.yaml:266-268,
templates/metrics-configmap.yaml:9-11), so DEFAULT_FIELDS repeats the default's active lines
(metrics-configmap.yaml:12-100) and HEALTH_FIELDS adds lines the default has commented out (ECC :56, retired
pages :61-63, NVLink errors :67-69) and the exporter's own per-code XID count, `DCGM_EXP_XID_ERRORS_COUNT`
(an exporter counter, field id 9001 in NVIDIA/dcgm-exporter's tests; its window is the exporter's
`--xid-count-window-size` flag, CLIXIDCountWindowSize in `pkg/cmd/app.go`; line numbers not checked here).
"""

from __future__ import annotations

DEFAULT_FIELDS = (
    "DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK, gauge, Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_MEMORY_TEMP, gauge, Memory temperature (in C).",
    "DCGM_FI_DEV_GPU_TEMP,    gauge, GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE,              gauge, Power draw (in W).",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy consumption since boot (in mJ).",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER, counter, Total number of PCIe retries.",
    "DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL, gauge, Memory utilization (in %).",
    "DCGM_FI_DEV_ENC_UTIL,      gauge, Encoder utilization (in %).",
    "DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).",
    "DCGM_FI_DEV_XID_ERRORS,            gauge,   Value of the last XID error encountered.",
    "DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL,            counter, Total number of NVLink bandwidth counters for all lanes.",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS, counter, Number of remapped rows for uncorrectable errors",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS,   counter, Number of remapped rows for correctable errors",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE,           gauge,   Whether remapping of rows has failed",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE,   gauge, Ratio of time the graphics engine is active.",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, Ratio of cycles the tensor (HMMA) pipe is active.",
    "DCGM_FI_PROF_DRAM_ACTIVE,        gauge, Ratio of cycles the device memory interface is active"
    " sending or receiving data.",
    "DCGM_FI_PROF_PCIE_TX_BYTES,      gauge, The rate of data transmitted over the PCIe bus - including"
    " both protocol headers and data payloads - in bytes per second.",
    "DCGM_FI_PROF_PCIE_RX_BYTES,      gauge, The rate of data received over the PCIe bus - including"
    " both protocol headers and data payloads - in bytes per second.",
)
HEALTH_FIELDS = (
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.",
    "DCGM_FI_DEV_RETIRED_SBE,     counter, Total number of retired pages due to single-bit errors.",
    "DCGM_FI_DEV_RETIRED_DBE,     counter, Total number of retired pages due to double-bit errors.",
    "DCGM_FI_DEV_RETIRED_PENDING, counter, Total number of pages pending retirement.",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, counter, Total number of NVLink data CRC errors.",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,   counter, Total number of NVLink retries.",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, counter, Total number of NVLink recovery errors.",
    "DCGM_EXP_XID_ERRORS_COUNT, gauge, Count of XID Errors within user-specified time window (see "
    "xid-count-window-size param).",
)


def metrics_csv() -> str:
    return "\n".join(["# DCGM FIELD, Prometheus metric type, help message", *DEFAULT_FIELDS, *HEALTH_FIELDS]) + "\n"


def exported_names() -> set[str]:
    return {line.split(",", 1)[0].strip() for line in (*DEFAULT_FIELDS, *HEALTH_FIELDS)}
