# GPU image: CUDA torch 2.13.0 + vllm 0.32 + flash-attn (compiled here, needs nvcc from the devel image).
# Not built in CI (no Docker engine there); the CPU install is scripts/setup.sh.
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/roll_lite
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN pip install --no-cache-dir torch==2.13.0
COPY . .
RUN pip install --no-cache-dir -c constraints-cpu.txt -e ".[gpu]" --no-build-isolation
ENTRYPOINT ["roll-train"]
CMD ["--config", "configs/grpo_gpu.yaml"]
