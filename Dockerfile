# Multi-stage image: the build stage uses the same scripts as the README; the runtime stage has
# only the runtime libraries and the binary (no compiler, headers or test dependencies).
#   docker build -t trainer .
#   mkdir -p data jobs
#   docker run --rm -u $(id -u):$(id -g) -v $PWD/data:/work/data trainer \
#     make-dataset --out data/sample --classes 5 --per-class 100 --image-size 64 --seed 0
#   docker run --rm -u $(id -u):$(id -g) -v $PWD/data:/work/data -v $PWD/jobs:/work/jobs trainer \
#     --config /opt/trainer/configs/quickstart.yaml --epochs 5 --job-dir jobs/x
# The configs' data paths are relative to the working directory /work, so data is mounted at
# /work/data and job dirs at /work/jobs. scripts/docker-check.sh builds and runs exactly this.
# The Debian release is a build argument: --build-arg DEBIAN_RELEASE=trixie builds on Debian 13
# (LibTorch 2.6), bookworm on Debian 12 (LibTorch 1.13); install-deps.sh knows both.
# Dockerfile.cuda is the GPU variant.
ARG DEBIAN_RELEASE=bookworm
FROM debian:${DEBIAN_RELEASE}-slim AS build
WORKDIR /src
COPY scripts/install-deps.sh scripts/install-deps.sh
RUN bash scripts/install-deps.sh
COPY . .
RUN bash scripts/build.sh -DTRAINER_BUILD_TESTS=OFF

FROM debian:${DEBIAN_RELEASE}-slim
COPY scripts/install-deps.sh /tmp/install-deps.sh
RUN TRAINER_RUNTIME_ONLY=1 bash /tmp/install-deps.sh && rm -rf /var/lib/apt/lists/* /tmp/install-deps.sh
COPY --from=build /src/build/app/trainer /usr/local/bin/trainer
COPY configs /opt/trainer/configs
WORKDIR /work
ENTRYPOINT ["trainer"]
