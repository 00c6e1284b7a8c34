{{/* The DRA kubelet plugin (dra.enabled): its names, labels and the resource.k8s.io version of its DeviceClasses. */}}
{{- define "nvidia-device-plugin.draName" -}}
{{- printf "%s-dra-kubelet-plugin" (include "nvidia-device-plugin.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The DRA kubelet plugin's own host directory: its socket, checkpoint and the GPU hand-over files. */}}
{{- define "nvidia-device-plugin.draPluginDir" -}}
{{- printf "%s/gpu.nvidia.com" (trimSuffix "/" (.Values.dra | default dict).kubeletPluginsDirectoryPath) }}
{{- end }}

{{- define "nvidia-device-plugin.draSelectorLabels" -}}
app.kubernetes.io/name: nvdp-dra-kubelet-plugin
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "nvidia-device-plugin.draLabels" -}}
helm.sh/chart: {{ include "nvidia-device-plugin.chart" . }}
{{ include "nvidia-device-plugin.draSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* resource.k8s.io/v1 unless the cluster is known to serve only an older version (1.32: v1beta1, 1.33: v1beta2). */}}
{{- define "nvidia-device-plugin.draApiVersion" -}}
{{- if .Capabilities.APIVersions.Has "resource.k8s.io/v1" -}}
resource.k8s.io/v1
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta2" -}}
resource.k8s.io/v1beta2
{{- else if .Capabilities.APIVersions.Has "resource.k8s.io/v1beta1" -}}
resource.k8s.io/v1beta1
{{- else -}}
resource.k8s.io/v1
{{- end }}
{{- end }}

{{/*
The DRA plugin's METRICS_ADDRESS: dra.metricsAddress while metrics.enabled, else "" (off). One that
is not "[host]:port" (a port from 1 to 65535: the container's port) fails the render.
*/}}
{{- define "nvidia-device-plugin.draMetricsAddress" -}}
{{- $address := ((.Values.dra | default dict).metricsAddress | default "") | toString }}
{{- if $address }}
{{- $port := include "nvidia-device-plugin.draMetricsPort" . | int }}
{{- if or (not (regexMatch "^(\\[[^\\]]*\\]|[^:\\[\\]]*):[0-9]+$" $address)) (lt $port 1) (gt $port 65535) }}
{{- fail (printf "dra.metricsAddress: invalid address %q (expected \"[host]:port\" with a port from 1 to 65535, or \"\" to disable)" $address) }}
{{- end }}
{{- end }}
{{- if .Values.metrics.enabled }}
{{- $address }}
{{- end }}
{{- end }}

{{/* The port of dra.metricsAddress. */}}
{{- define "nvidia-device-plugin.draMetricsPort" -}}
{{- regexFind "[0-9]+$" (((.Values.dra | default dict).metricsAddress | default "") | toString) | default "0" | int }}
{{- end }}
