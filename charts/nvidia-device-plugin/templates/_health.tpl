{{/*
"true" when the plugin may taint its Node (health.taintOnFatal in a config entry): the ClusterRole
then grants `nodes: patch` and the plugin's pods tolerate the taint (a NoExecute taint must not evict
the plugin, which removes the taint on recovery). `gpuHealthTaint` true / false decides; null reads
every entry of `config.map`, or of the existing ConfigMap `config.name` at install time (where it
cannot be read, nothing: set gpuHealthTaint=true). A value the plugin would refuse fails the render,
in the plugin's words.
*/}}
{{- define "nvidia-device-plugin.healthTaint" -}}
{{- $entries := dict }}
{{- if .Values.config.name }}
{{- $found := lookup "v1" "ConfigMap" (include "nvidia-device-plugin.namespace" .) .Values.config.name }}
{{- $entries = (($found | default dict).data) | default dict }}
{{- else if .Values.config.map }}
{{- $entries = .Values.config.map }}
{{- end }}
{{- $effects := list "NoSchedule" "PreferNoSchedule" "NoExecute" }}
{{- $asked := false }}
{{- range $name, $content := $entries }}
{{- $file := kindIs "map" $content | ternary $content (fromYaml (toString $content)) }}
{{- $health := $file.health | default dict }}
{{- if kindIs "map" $health }}
{{- $effect := $health.taintOnFatal }}
{{- if not (kindIs "invalid" $effect) }}
{{- if not (has $effect $effects) }}
{{- fail (printf "config.map.%s: health.taintOnFatal: invalid value %q (accepted: %s)" $name (toString $effect) (join ", " $effects)) }}
{{- end }}
{{- $asked = true }}
{{- end }}
{{- end }}
{{- end }}
{{- if kindIs "bool" .Values.gpuHealthTaint }}
{{- .Values.gpuHealthTaint }}
{{- else }}
{{- $asked }}
{{- end }}
{{- end }}
