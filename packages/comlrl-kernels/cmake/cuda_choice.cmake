# Whether to build the CUDA module, decided before any CUDA compiler is looked for (works
# in a project and in `cmake -P` script mode, which the tests use).
#
# comlrl_cuda_choice(<with_cuda> <out_build> <out_reason>) sets <out_build> to
#   ON    build it (COMLRL_WITH_CUDA=ON: a missing nvcc is an error; AUTO: when nvcc works),
#   OFF   do not (COMLRL_WITH_CUDA=OFF, or AUTO on a machine that shows no GPU),
# and <out_reason> to why. AUTO builds the CUDA module only where a GPU is visible: an
# nvcc on a machine without a GPU (a CPU node, a container with the toolkit installed)
# would otherwise compile for minutes a module nothing there can run.
#
# A GPU is visible when the NVIDIA driver lists one in /proc/driver/nvidia/gpus or
# `nvidia-smi -L` does. COMLRL_NVIDIA_PROC and COMLRL_NVIDIA_SMI name other places to
# look (tests); COMLRL_GPU_VISIBLE=ON|OFF skips the look (a build for another machine).

function(comlrl_gpu_visible out_visible out_how)
  if(DEFINED COMLRL_GPU_VISIBLE AND NOT COMLRL_GPU_VISIBLE STREQUAL "")
    set(${out_visible} ${COMLRL_GPU_VISIBLE} PARENT_SCOPE)
    set(${out_how} "COMLRL_GPU_VISIBLE=${COMLRL_GPU_VISIBLE}" PARENT_SCOPE)
    return()
  endif()
  set(proc "/proc/driver/nvidia/gpus")
  if(DEFINED COMLRL_NVIDIA_PROC)
    set(proc "${COMLRL_NVIDIA_PROC}")
  endif()
  file(GLOB gpus "${proc}/*")
  if(gpus)
    set(${out_visible} ON PARENT_SCOPE)
    set(${out_how} "the driver lists a GPU in ${proc}" PARENT_SCOPE)
    return()
  endif()
  if(DEFINED COMLRL_NVIDIA_SMI)
    set(smi "${COMLRL_NVIDIA_SMI}")
  else()
    find_program(COMLRL_FOUND_NVIDIA_SMI nvidia-smi)
    set(smi "${COMLRL_FOUND_NVIDIA_SMI}")
  endif()
  if(smi AND EXISTS "${smi}")
    execute_process(COMMAND "${smi}" -L RESULT_VARIABLE rc OUTPUT_VARIABLE listed
                    ERROR_QUIET TIMEOUT 30)
    if(rc EQUAL 0 AND listed MATCHES "GPU [0-9]+:")
      set(${out_visible} ON PARENT_SCOPE)
      set(${out_how} "nvidia-smi -L lists a GPU" PARENT_SCOPE)
      return()
    endif()
  endif()
  set(${out_visible} OFF PARENT_SCOPE)
  set(${out_how} "no GPU visible: no /proc/driver/nvidia/gpus entry, nvidia-smi -L lists none"
      PARENT_SCOPE)
endfunction()

function(comlrl_cuda_choice with_cuda out_build out_reason)
  if(with_cuda STREQUAL "OFF")
    set(${out_build} OFF PARENT_SCOPE)
    set(${out_reason} "disabled (COMLRL_WITH_CUDA=OFF)" PARENT_SCOPE)
  elseif(with_cuda STREQUAL "ON")
    set(${out_build} ON PARENT_SCOPE)
    set(${out_reason} "asked for (COMLRL_WITH_CUDA=ON)" PARENT_SCOPE)
  else()
    comlrl_gpu_visible(visible how)
    if(visible)
      set(${out_build} ON PARENT_SCOPE)
      set(${out_reason} "COMLRL_WITH_CUDA=AUTO and ${how}" PARENT_SCOPE)
    else()
      set(${out_build} OFF PARENT_SCOPE)
      set(${out_reason} "skipped (COMLRL_WITH_CUDA=AUTO and ${how}; COMLRL_WITH_CUDA=ON builds it)"
          PARENT_SCOPE)
    endif()
  endif()
endfunction()
