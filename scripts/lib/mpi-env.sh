# Sourced by the scripts that launch ranks with mpirun on one machine: Open MPI may run as root
# (CI does), put more ranks than cores on it, and copy between ranks without CMA (containers
# forbid it). tests/CMakeLists.txt sets the same for CTest's multi-rank tests.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
