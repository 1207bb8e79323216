
#compdef kcli

_kcli_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _KCLI_COMPLETE=complete_zsh kcli)
}

compdef _kcli_completion kcli

