# GPU image: CUDA torch 2.13.0 + vllm 0.32 + flash-attn (compiled here, needs nvcc from the devel image).
# vllm 0.32.0's wheel is built for CUDA 13.0 (it pulls nvidia-cutlass-dsl[cu13]), so nvcc must be 13.0
# too: flash-attn's build refuses an nvcc whose CUDA differs from torch's.
# Not built yet: no Docker engine on the machines we have (CI neither); the CPU install is scripts/setup.sh.
FROM nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/roll_lite
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir torch==2.13.0
COPY . .
RUN pip install --no-cache-dir -c constraints-cpu.txt -e ".[gpu]" --no-build-isolation
# One image for every node: `head`, `worker HEAD_IP:PORT` or roll-train's arguments (scripts/docker_entrypoint.sh;
# docs/gpus-and-clusters.md: several hosts)
ENTRYPOINT ["/opt/roll_lite/scripts/docker_entrypoint.sh"]
CMD ["--config", "configs/grpo_gpu.yaml"]
