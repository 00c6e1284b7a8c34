{{/* GPU feature discovery: its name and whether labels go through the Node Feature API. */}}
{{- define "nvidia-device-plugin.gfdName" -}}
{{- printf "%s-%s" (include "nvidia-device-plugin.fullname" .) ((.Values.gfd | default dict).nameOverride | default "gpu-feature-discovery") | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* "true" when gfd.enabled and NVIDIA's nfd.enableNodeFeatureApi (or nvdp's gfd.useNodeFeatureAPI). */}}
{{- define "nvidia-device-plugin.gfdNodeFeatureAPI" -}}
{{- $gfd := .Values.gfd | default dict }}
{{- $nfd := .Values.nfd | default dict }}
{{- and $gfd.enabled (or $nfd.enableNodeFeatureApi $gfd.useNodeFeatureAPI) | toString }}
{{- end }}
