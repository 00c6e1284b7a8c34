{{/*
MPS. "mpsEnabled" is "true" when the MPS control daemon DaemonSet is rendered and the plugin gets
MPS_ROOT and the MPS root mount: mps.enabled when set; else with an external ConfigMap (config.name),
whose entries the chart cannot know (they may change after the install, as the GPU operator's do),
as NVIDIA's chart renders it on every install; else whether an entry of config.map shares GPUs with
MPS (sharing.mps.resources). Without any ConfigMap no config file can ask for MPS.
*/}}
{{- define "nvidia-device-plugin.mpsEnabled" -}}
{{- $mps := .Values.mps | default dict }}
{{- if not (kindIs "invalid" $mps.enabled) }}
{{- if eq (toString $mps.enabled) "true" }}true{{ end }}
{{- else if .Values.config.name }}true
{{- else }}
{{- $found := false }}
{{- range $name, $entry := (.Values.config.map | default dict) }}
{{- $parsed := dict }}
{{- if kindIs "map" $entry }}
{{- $parsed = $entry }}
{{- else }}
{{- $parsed = fromYaml (toString $entry) }}
{{- end }}
{{- $sharing := $parsed.sharing | default dict }}
{{- if kindIs "map" $sharing }}
{{- $section := $sharing.mps | default dict }}
{{- if and (kindIs "map" $section) $section.resources }}
{{- $found = true }}
{{- end }}
{{- end }}
{{- end }}
{{- if $found }}true{{ end }}
{{- end }}
{{- end }}

{{- define "nvidia-device-plugin.mpsRoot" -}}
{{- (.Values.mps | default dict).root | default "/run/nvidia/mps" }}
{{- end }}
