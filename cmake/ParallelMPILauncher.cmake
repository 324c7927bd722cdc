# How tests start ranks, from scripts/mpi_launcher.sh: the one place that knows Open MPI's mpirun and
# Hydra (MPICH, Intel MPI, MVAPICH2). Any MPI is picked as FindMPI picks it; for another than the
# default one: -DMPI_C_COMPILER=mpicc.mpich -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich (README).
#
#   parallel_mpi_launcher(<var> <what> <mpiexec>)   <what>: kind, flags, env, tcp, rank-var
# sets <var> to the helper's answer as a list.
function(parallel_mpi_launcher var what mpiexec)
  execute_process(COMMAND bash ${PROJECT_SOURCE_DIR}/scripts/mpi_launcher.sh ${what} ${mpiexec}
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "scripts/mpi_launcher.sh ${what} ${mpiexec} failed (${rc})")
  endif()
  string(REPLACE "\n" ";" out "${out}")
  set(${var} "${out}" PARENT_SCOPE)
endfunction()
