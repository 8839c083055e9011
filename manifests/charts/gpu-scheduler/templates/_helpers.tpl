{{- define "gpu-scheduler.labels" -}}
app.kubernetes.io/name: gpu-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gpu-scheduler.config" -}}
{{- if not (has .Values.nodeAgent (list "hami" "plain")) -}}
{{- fail (printf "nodeAgent must be hami or plain, not %q" .Values.nodeAgent) -}}
{{- end -}}
{{- $cfg := .Files.Get "files/scheduler-config.yaml" | fromYaml -}}
{{- $_ := set $cfg.leaderElection "leaderElect" .Values.leaderElection -}}
{{- $profile := index $cfg.profiles 0 -}}
{{- $_ := set $profile "schedulerName" .Values.schedulerName -}}
{{- $seen := dict -}}
{{- range $pc := $profile.pluginConfig -}}
{{- $_ := set $seen $pc.name true -}}
{{- if eq $pc.name "GPUFit" -}}
{{- $_ := set $pc.args "accountingOnlySharing" $.Values.accountingOnlySharing -}}
{{- $_ := set $pc.args.hami "enabled" (eq $.Values.nodeAgent "hami") -}}
{{- end -}}
{{- with index $.Values.pluginArgs $pc.name -}}
{{- $_ := set $pc "args" (mustMergeOverwrite $pc.args .) -}}
{{- end -}}
{{- end -}}
{{- range $name, $args := .Values.pluginArgs -}}
{{- if not (hasKey $seen $name) -}}
{{- $_ := set $profile "pluginConfig" (append $profile.pluginConfig (dict "name" $name "args" $args)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}
